"""The report's page and tables: the HTML checked structurally (every table in a scrolling container, images
inlined, nothing external), hyperparameters and versions, the comparison table, and ``--x``/``--smooth``."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser

import pytest

from trainwell.cli import main
from trainwell.report import load_run, write_comparison, write_report
from trainwell.report.tables import comparison_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LONG_NAME = "a_run_with_a_very_long_name_" * 5
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class PageStructure(HTMLParser):
    """What the structural checks need: each table's parent element, the images, every URL-like attribute,
    the tags used and the style sheet."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, dict[str, str]]] = []
        self.table_parents: list[tuple[str, str]] = []
        self.images: list[str] = []
        self.urls: list[str] = []
        self.tags: set[str] = set()
        self.style = ""

    def handle_starttag(self, tag, attrs):
        attributes = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        if tag == "table":
            parent_tag, parent_attrs = self.stack[-1]
            self.table_parents.append((parent_tag, parent_attrs.get("class", "")))
        if tag == "img":
            self.images.append(attributes.get("src", ""))
        self.urls += [v for k, v in attributes.items() if k in ("src", "href", "action", "srcset", "poster")]
        if tag not in _VOID:
            self.stack.append((tag, attributes))

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if self.stack and self.stack[-1][0] == "style":
            self.style += data


def check_page(html_text: str, folder) -> PageStructure:
    """Fail unless the page is self-contained and every table scrolls inside its own container."""
    page = PageStructure()
    page.feed(html_text)
    assert page.table_parents and all(p == ("div", "scroll") for p in page.table_parents), page.table_parents
    assert ".scroll{overflow-x:auto" in page.style and "overflow-wrap:" in page.style
    for src in page.images:
        if src.startswith("data:image/png;base64,"):
            assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_MAGIC
        else:
            assert (folder / src).is_file(), src
    assert not [u for u in page.urls if not u.startswith("data:")], page.urls
    assert not page.tags & {"script", "link", "iframe", "object", "embed", "base"}
    assert "url(" not in page.style and "@import" not in page.style
    return page


def wide_run(tmp_path, name=LONG_NAME, lr=3e-4, accuracy=0.5):
    """A run whose log entries have many long-named metrics (a table far wider than any page)."""
    folder = tmp_path / name
    folder.mkdir(parents=True)
    history = []
    for step in (10, 20, 30):
        history.append({"loss": 4.0 - step / 10, "learning_rate": lr, "epoch": step / 30, "step": step})
        history.append({"eval_loss": 3.5 - step / 20, "eval_accuracy": accuracy + step / 100, "step": step,
                        **{f"eval_a_metric_with_a_long_name_number_{i}": i + step / 7 for i in range(6)}})
    history.append({"train_runtime": 12.0, "train_samples_per_second": 20.0, "train_steps_per_second": 2.5,
                    "train_loss": 3.0, "total_flos": 0.0, "step": 30})
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 30, "max_steps": 30,
                                                           "log_history": history}))
    (folder / "training_args.json").write_text(json.dumps({
        "learning_rate": lr, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 4, "max_steps": 30,
        "num_train_epochs": 3.0, "lr_scheduler_type": "cosine", "warmup_steps": 3, "weight_decay": 0.01,
        "seed": 7, "bf16": True, "fp16": False, "tf32": None, "optim": "adamw_torch"}))
    return folder


def test_the_page_fits_its_tables_and_is_self_contained(tmp_path):
    report = write_report(wide_run(tmp_path))
    page = check_page(report.html.read_text(), report.out_dir)
    html_text = report.html.read_text()
    assert "long_<wbr>name_<wbr>number_<wbr>5" in html_text  # long names wrap at underscores
    assert "<h2>Hyperparameters</h2>" in html_text and "<h2>Last log entries</h2>" in html_text
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'trainwell[report]')")
    assert len(page.images) == len(report.images) >= 3


def test_the_comparison_page_is_checked_the_same_way(tmp_path):
    runs = [wide_run(tmp_path, "slow", lr=1e-4, accuracy=0.4), wide_run(tmp_path, "fast", lr=1e-3)]
    report = write_comparison(runs, tmp_path / "cmp")
    check_page(report.html.read_text(), report.out_dir)
    html_text = report.html.read_text()
    assert "<h2>Final and best metrics</h2>" in html_text and "<h2>Run: slow</h2>" in html_text
    assert "<th class='diff'>learning rate</th>" in html_text  # what differs between the runs stands out
    assert "<th>seed</th>" in html_text


def test_hyperparameters_and_versions_in_the_summary(tmp_path):
    folder = wide_run(tmp_path, "hp")
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "transformers_version": "5.1.0"}))
    (folder / "README.md").write_text("### Framework versions\n\n- trainwell 0.4.0\n- Pytorch 2.9.0\n")
    run = load_run(folder)
    assert run.info == {
        "learning rate": "0.0003", "batch size per device": "8", "gradient accumulation": "4",
        "length": "max_steps=30", "scheduler": "cosine, warmup 3 steps", "weight decay": "0.01", "seed": "7",
        "optimizer": "adamw_torch", "precision": "bf16 mixed", "transformers version": "5.1.0",
        "trainwell version": "0.4.0", "torch version": "2.9.0"}
    text = write_report(folder).text
    assert "hyperparameters:\n  learning rate" in text and "precision              bf16 mixed" in text


def test_hyperparameters_from_a_checkpoint_and_never_from_a_pickle(tmp_path):
    folder = wide_run(tmp_path, "ckpt")
    args = (folder / "training_args.json").read_text()
    (folder / "training_args.json").unlink()
    (folder / "checkpoint-10").mkdir()
    (folder / "checkpoint-20").mkdir()
    (folder / "checkpoint-20" / "training_args.json").write_text(args.replace('"max_steps": 30', '"max_steps": 0'))
    assert load_run(folder).info["length"] == "3 epochs"  # max_steps=0: the epochs are the length
    (folder / "checkpoint-20" / "training_args.json").unlink()
    (folder / "training_args.bin").write_bytes(b"not a pickle anyone should open")  # the reference's file
    assert load_run(folder).info == {}


def test_the_comparison_table_has_final_and_best_metrics_per_run(tmp_path):
    runs = [load_run(wide_run(tmp_path, "a", accuracy=0.4)), load_run(wide_run(tmp_path, "b", accuracy=0.6))]
    rows = comparison_rows(runs)
    assert [r["run"] for r in rows] == ["a", "b"]
    assert rows[0]["final train loss"] == "1 (step 30)" and rows[0]["best eval_loss"] == "2 (step 30)"
    assert rows[0]["final eval_accuracy"] == "0.7" and rows[1]["final eval_accuracy"] == "0.9"
    assert rows[0]["runtime"] == "12.0 s" and rows[0]["mean train loss"] == "2"
    assert list(rows[0])[:5] == ["run", "steps", "runtime", "final train loss", "mean train loss"]
    assert "final eval_loss" in rows[0] and not any("runtime" in k and k != "runtime" for k in rows[0])


def test_the_command_line_x_axis_and_smoothing(tmp_path, capsys):
    folder = wide_run(tmp_path, "cli")
    assert main(["report", str(folder), "--x", "tokens"]) == 2
    err = capsys.readouterr().err
    assert "--x tokens: the log entries of cli have no num_input_tokens_seen" in err
    assert "include_num_input_tokens_seen=True" in err and not (folder / "report").exists()  # nothing written
    assert main(["report", str(folder), "--x", "epoch", "--smooth", "0.5"]) == 0
    assert main(["report", str(folder), "--x", "time"]) == 0  # estimated from the summary's runtime
    with pytest.raises(SystemExit):
        main(["report", str(folder), "--smooth", "1.5"])
    assert "pass a number in [0, 1)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["report", str(folder), "--x", "wall"])


def test_search_trials_side_by_side(tmp_path, capsys):
    """A search's output_dir: its run-* trials compared, each row naming the trial's parameters, the argument
    the search varied highlighted among the hyperparameters (read from each trial's checkpoint)."""
    for trial, lr, losses in (("run-0", 0.1, [3.0, 1.0]), ("run-1", 1e-5, [3.0, 2.9])):
        checkpoint = tmp_path / trial / "checkpoint-2"
        checkpoint.mkdir(parents=True)
        history = [{"loss": v + 0.5, "step": i + 1} for i, v in enumerate(losses)]
        history += [{"eval_loss": v, "step": i + 1} for i, v in enumerate(losses)]
        (checkpoint / "trainer_state.json").write_text(json.dumps(
            {"global_step": 2, "max_steps": 2, "log_history": sorted(history, key=lambda e: e["step"]),
             "trial_params": {"learning_rate": lr}, "trial_name": trial}))
        (checkpoint / "training_args.json").write_text(json.dumps({"learning_rate": lr, "seed": 42}))
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.split("hyperparameters:")[0].splitlines()[1:] if line.strip()]
    assert rows[0][:3] == ["run", "trial", "steps"]
    assert rows[1][:2] == ["run-0", "learning_rate=0.1"] and rows[2][:2] == ["run-1", "learning_rate=1e-05"]
    page = (tmp_path / "report" / "index.html").read_text()
    check_page(page, tmp_path / "report")
    assert "<th class='diff'>learning rate</th>" in page and "<th>seed</th>" in page
    assert "1 (step 2)" in page and "2.9 (step 2)" in page  # best validation loss per trial
