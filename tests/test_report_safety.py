"""``trainwell report`` on a run folder someone else could write into (issue 26): it writes only its own files, never
through a link; every summary value stays on one line; any metric name becomes a safe file name; and every
malformed history ends handled or in the command's one-line error, never in a traceback."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.common.cli import run_cli
from trainwell.report import UnsafePathError, load_run, write_report
from trainwell.report.files import file_names, file_stem
from trainwell.report.tables import one_line
from trainwell.utils.safe_files import SafeFolder, write_text_file

pytestmark = pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")


def _history(n=6, **extra_entry):
    history = [
        {"loss": 2.0 - i / 10, "learning_rate": 0.1, "epoch": i / 10, "step": i, **extra_entry} for i in range(1, n + 1)
    ]
    history.append({"eval_loss": 1.5, "eval_acc/top1": 0.5, "epoch": n / 10, "step": n})
    return history


def _run_dir(tmp_path, history=None, args=None, name="run"):
    run = tmp_path / name
    run.mkdir(parents=True, exist_ok=True)
    history = _history() if history is None else history
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 6, "max_steps": 6, "log_history": history}))
    if args is not None:
        (run / "training_args.json").write_text(json.dumps(args))
    return run


@pytest.fixture
def victim(tmp_path):
    """A file outside the run that a link inside it points to: it must never change."""
    target = tmp_path / "victim" / "keep.txt"
    target.parent.mkdir()
    target.write_text("precious\n")
    return target


# --- never through a link --------------------------------------------------------------------------------------------


def test_a_report_folder_that_is_a_link_is_refused_in_one_line(tmp_path, capsys, victim):
    run = _run_dir(tmp_path)
    (run / "report").symlink_to(victim.parent, target_is_directory=True)
    code, out, err = run_cli(capsys, "report", run)
    assert code == 2 and out == ""
    assert err.splitlines()[0].startswith(f"trainwell report: error: {run / 'report'} is a symbolic link")
    assert "Remove the link, or name another folder" in err and "Traceback" not in err
    assert sorted(os.listdir(victim.parent)) == ["keep.txt"] and victim.read_text() == "precious\n"
    with pytest.raises(UnsafePathError):
        write_report(run)


def test_a_dangling_report_link_and_a_report_file_are_refused(tmp_path, capsys):
    run = _run_dir(tmp_path)
    (run / "report").symlink_to(tmp_path / "nowhere")
    code, _, err = run_cli(capsys, "report", run)
    assert code == 2 and "is a symbolic link" in err and not (tmp_path / "nowhere").exists()
    (run / "report").unlink()
    (run / "report").write_text("not a folder")
    code, _, err = run_cli(capsys, "report", run)
    assert code == 2 and "exists and is not a folder" in err


@pytest.mark.parametrize("name", ["index.html", "summary.txt", "loss.png", "learning_rate.png"])
def test_a_report_file_that_is_a_link_is_replaced_not_followed(tmp_path, capsys, victim, name):
    run = _run_dir(tmp_path)
    (run / "report").mkdir()
    (run / "report" / name).symlink_to(victim)
    code, _, err = run_cli(capsys, "report", run)
    assert code == 0, err
    assert victim.read_text() == "precious\n"
    written = run / "report" / name
    assert not written.is_symlink() and written.stat().st_size > 0
    assert not [f for f in os.listdir(run / "report") if f.endswith(".tmp")]  # no temporary file left behind


def test_an_out_folder_the_user_names_is_used_as_named(tmp_path, capsys):
    """``--out`` is the user's choice: a link they name is followed (its files still never are)."""
    run = _run_dir(tmp_path)
    real = tmp_path / "real-out"
    real.mkdir()
    (tmp_path / "out-link").symlink_to(real, target_is_directory=True)
    code, _, err = run_cli(capsys, "report", run, "--out", tmp_path / "out-link")
    assert code == 0, err
    assert (real / "index.html").is_file() and (real / "summary.txt").is_file()


def test_a_search_folder_default_report_link_is_refused(tmp_path, capsys, victim):
    search = tmp_path / "search"
    for trial in ("run-0", "run-1"):
        _run_dir(search, name=trial)
    (search / "report").symlink_to(victim.parent, target_is_directory=True)
    code, _, err = run_cli(capsys, "report", search)
    assert code == 2 and "is a symbolic link" in err and sorted(os.listdir(victim.parent)) == ["keep.txt"]


def test_a_report_that_cannot_be_written_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """A read-only or full disk: the error names the file, in one line (monkeypatched, since root writes anywhere)."""
    run = _run_dir(tmp_path)

    def refuse(self, name, data):
        raise PermissionError(13, "Permission denied", str(self.path / name))

    monkeypatch.setattr(SafeFolder, "write_bytes", refuse)
    code, _, err = run_cli(capsys, "report", run)
    assert code == 2 and "Traceback" not in err, err
    assert err.splitlines()[0].startswith(f"trainwell report: error: cannot read or write {run / 'report'}/")
    assert "Permission denied" in err


def test_the_model_card_replaces_a_readme_link(tmp_path, victim):
    from tests.common.models import RegressionDataset, RegressionModel
    from tests.conftest import make_args
    from trainwell import Trainer

    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").symlink_to(victim)
    trainer = Trainer(
        model=RegressionModel(), args=make_args(str(out), max_steps=1), train_dataset=RegressionDataset(length=8)
    )
    trainer.create_model_card()
    assert victim.read_text() == "precious\n"
    assert not (out / "README.md").is_symlink() and "generated_from_trainer" in (out / "README.md").read_text()


def test_safe_folder_writes_by_plain_name_only(tmp_path, victim):
    with SafeFolder(tmp_path / "a" / "b") as folder:
        assert folder.write_text("x.txt", "hi").read_text() == "hi"
        for bad in ("../x", "sub/x", "..", "", "x\0y"):
            with pytest.raises(ValueError, match="plain file name"):
                folder.write_text(bad, "no")
    link = tmp_path / "link.txt"
    link.symlink_to(victim)
    write_text_file(link, "new")
    assert victim.read_text() == "precious\n" and link.read_text() == "new" and not link.is_symlink()
    (tmp_path / "dir-link").symlink_to(victim.parent, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        SafeFolder(tmp_path / "dir-link", strict=True)


# --- one line per value --------------------------------------------------------------------------------------------


def test_summary_values_are_written_one_per_line(tmp_path, capsys):
    injected = "adamw\ninjected: line\r\x1b[31mred\u2028sep"
    run = _run_dir(tmp_path / "runs", args={"optim": injected, "seed": "1\n2", "learning_rate": 0.1}, name="run\nname")
    (run / "trainer_state.json").write_text(
        json.dumps(
            {
                "global_step": 3,
                "max_steps": 3,
                "best_model_checkpoint": "ckpt\nbest: fake",
                "log_history": _history(n=3),
            }
        )
    )
    code, out, err = run_cli(capsys, "report", run)
    assert code == 0, err
    summary = (run / "report" / "summary.txt").read_text()
    lines = summary.splitlines()
    assert not any(line.startswith(("injected", "best: fake", "2", "name")) for line in lines), summary
    optimizer = [line.split(None, 1) for line in lines if line.strip().startswith("optimizer")]
    assert optimizer == [["optimizer", r"adamw\ninjected: line\r\x1b[31mred\u2028sep"]], summary
    assert r"ckpt\nbest: fake" in summary and r"run\nname" in summary
    assert "\x1b" not in out and summary.strip() in out  # the terminal gets the same escaped text


def test_one_line_escapes_every_line_break():
    breaks = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
    escaped = one_line("a" + breaks + "b\ud800\u202e")
    assert len(escaped.splitlines()) == 1 and escaped.startswith("a\\n\\r\\x0b") and "\\u202e" in escaped
    escaped.encode("utf-8")  # a lone surrogate no longer stops the file being written
    assert one_line("C:\\runs\\a") == "C:\\runs\\a"  # backslashes are left readable


# --- metric names as file names --------------------------------------------------------------------------------------


def test_file_names_are_safe_readable_and_unique():
    names = [
        "loss",
        "eval_accuracy",
        "eval_acc/top1",
        "eval_acc_top1",
        "../../etc/passwd",
        "$x$",
        "a" * 10_000,
        "Eval_Accuracy",
        "",
        ".hidden",
        "eval_x-0123abcd",
    ]
    files = file_names(names)
    assert files["loss"] == "loss.png" and files["eval_accuracy"] == "eval_accuracy.png"
    assert files["eval_acc/top1"].startswith("eval_acc_top1-") and files["eval_acc_top1"] == "eval_acc_top1.png"
    assert len({f.lower() for f in files.values()}) == len(names)
    for name, file in files.items():
        assert "/" not in file and not file.startswith(".") and len(file) <= 100, (name, file)
    assert file_stem("eval_x-0123abcd") != "eval_x-0123abcd"  # a plain name never looks like a hashed one


def test_a_metric_named_like_a_path_gets_its_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = _run_dir(tmp_path)
    code, out, err = run_cli(capsys, "report", run)
    assert code == 0, err
    plots = sorted(os.listdir(run / "report"))
    assert any(p.startswith("eval_acc_top1-") and p.endswith(".png") for p in plots), plots
    assert not (run / "report" / "eval_acc").exists()
    assert "eval_acc_top1-" in out


@pytest.mark.parametrize(
    "metric", ["eval_$x$", "eval_$\\frac$", "eval_" + "m" * 10_000, "eval_a$b$c$", "eval_\n\x1b[2J", "eval_\ud800"]
)
def test_hostile_metric_names_are_plotted_and_listed(tmp_path, capsys, metric):
    pytest.importorskip("matplotlib")
    history = _history(n=4)
    history.append({metric: 0.25, "step": 4})
    run = _run_dir(tmp_path, history=history)
    code, out, err = run_cli(capsys, "report", run)
    assert code == 0, err
    report = run / "report"
    pngs = [p for p in os.listdir(report) if p.endswith(".png")]
    assert len(pngs) == 4, pngs  # loss (with eval_loss), learning_rate, eval_acc/top1 and the hostile metric
    assert all(len(p) <= 100 for p in pngs)


# --- malformed histories -------------------------------------------------------------------------------------------


def test_entries_without_a_usable_step_or_not_objects_are_skipped_and_counted(tmp_path, capsys):
    history = _history(n=4)
    history[1:1] = [
        "xyzzy",
        [1, 2],
        None,
        {"loss": 1.0, "step": float("nan")},
        {"loss": 1.0, "step": float("inf")},
        {"loss": 1.0, "step": "7"},
        {"loss": 1.0, "step": True},
    ]
    run = _run_dir(tmp_path, history=history)
    code, out, err = run_cli(capsys, "report", run)
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith("skipped log entries"))
    assert line.split(None, 3)[3] == (
        "7 (log_history[1]: a string, not a JSON object; log_history[2]: a list, not "
        "a JSON object; log_history[3]: null, not a JSON object; ...)"
    )
    loaded = load_run(run)
    assert [s for s, _ in loaded.series["loss"]] == [1, 2, 3, 4] and len(loaded.skipped) == 7
    page = (run / "report" / "index.html").read_text()
    assert "xyzzy" not in page  # the last-entries table shows objects only


@pytest.mark.parametrize(
    "state",
    [
        {"log_history": "not a list"},
        {"log_history": [{"loss": 10**400, "step": 1}]},
        {"log_history": [{"loss": 1.0, "step": 10**30}, {"loss": 1.0, "step": -5}]},
        {"log_history": [{"step": 1, "train_runtime": "x", "train_steps_per_second": "y", "train_loss": None}]},
        {
            "log_history": [{"loss": 1.0, "step": 1}],
            "epoch": "one",
            "best_metric": "high",
            "trial_params": [1],
            "global_step": {"a": 1},
        },
        {"log_history": [{"loss": float("nan"), "epoch": float("nan"), "step": 1}, {"loss": float("inf"), "step": 2}]},
        {"log_history": []},
        [1, 2, 3],
    ],
)
def test_malformed_states_end_handled_or_in_one_line(tmp_path, capsys, state):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps(state))
    for x in ("step", "epoch", "time"):
        code, _, err = run_cli(capsys, "report", run, "--x", x)
        assert code in (0, 2) and "Traceback" not in err, err
        if code == 2:
            assert err.startswith("trainwell report: error: ") and len(err.splitlines()) == 2, err


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"\xff\xfe garbage", "is not UTF-8 text"),
        (b"[" * 100_000, "nested too deeply"),
        (b'{"log_history": [', "is not valid JSON"),
    ],
)
def test_unreadable_state_files_are_one_line_errors(tmp_path, capsys, content, expected):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_bytes(content)
    code, _, err = run_cli(capsys, "report", run)
    assert code == 2 and expected in err and "Traceback" not in err, err


def test_a_huge_integer_metric_is_an_infinity():
    from trainwell.report.sessions import number

    assert number(10**400) == math.inf and number(-(10**400)) == -math.inf and number(True) is None
