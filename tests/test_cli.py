"""The ``trainwell`` command: demo (tiny, with resume), train from configs (and their errors), report, env."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.common.timing import hang_timeout
from trainwell.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --- demo ----------------------------------------------------------------------------------------------------------


def test_demo_trains_reports_and_resumes(tmp_path, capsys):
    out = tmp_path / "demo"
    common = ["--size", "tiny", "--output-dir", out, "--evals", "2", "--sample-bytes", "16", "--device", "cpu"]
    code, text, _ = _run(capsys, "demo", "--steps", 4, *common)
    assert code == 0
    assert "validation loss:" in text and "at step 0" in text and "at step 4" in text
    assert "--- generated sample" in text and "where everything is:" in text
    assert (out / "model.safetensors").exists() and (out / "checkpoint-4").is_dir()
    assert (out / "report" / "index.html").exists()
    assert (out / "live_log.jsonl").is_file()  # the demo asks for the live log (report_to "live")
    state = json.loads((out / "trainer_state.json").read_text())
    evals = [e["eval_loss"] for e in state["log_history"] if "eval_loss" in e]
    assert len(evals) == 3 and all("eval_perplexity" in e for e in state["log_history"] if "eval_loss" in e)

    code, text, _ = _run(capsys, "demo", "--steps", 6, *common)  # same folder: resumes
    assert code == 0 and f"resuming from {out / 'checkpoint-4'}" in text
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    assert "at step 0" in text  # the starting loss is still the one measured before any training


def test_two_fresh_demos_with_one_seed_print_the_same_losses(tmp_path, capsys):
    def losses(folder: str) -> str:
        code, text, _ = _run(capsys, "demo", "--steps", 2, "--size", "tiny", "--evals", 1, "--sample-bytes", 4,
                             "--no-report", "--device", "cpu", "--output-dir", tmp_path / folder)
        assert code == 0
        return next(line for line in text.splitlines() if line.startswith("validation loss:"))

    assert losses("a") == losses("b")  # the initial weights follow --seed, not whatever ran before


@pytest.mark.parametrize("cuda", [None, "12.8"])
def test_demo_rejects_a_missing_device(capsys, monkeypatch, tmp_path, cuda):
    """A CPU-only torch build says so and how to get a CUDA one; a CUDA build without a visible GPU says that."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    code, _, err = _run(capsys, "demo", "--device", "cuda", "--output-dir", tmp_path / "d")
    assert code == 2 and not (tmp_path / "d").exists()
    if cuda is None:
        assert "is a CPU-only build: it cannot use a GPU. Install a CUDA build of torch" in err
        assert "pytorch.org/get-started" in err and "--device cpu" in err
    else:
        assert "(built for CUDA 12.8) sees no GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES" in err


# --- train ---------------------------------------------------------------------------------------------------------


def _write(path, text):
    path.write_text(text)
    return path


@pytest.fixture
def regression_files(tmp_path):
    rows = [{"input_x": x / 10, "labels": 2 * x / 10 + 1} for x in range(-20, 20)]
    jsonl = _write(tmp_path / "train.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    csv_file = _write(tmp_path / "eval.csv", "input_x,labels,name\n" + "".join(
        f"{r['input_x']},{r['labels']},row{i}\n" for i, r in enumerate(rows[:8])))
    return jsonl, csv_file


def test_train_from_yaml_with_overrides(tmp_path, capsys, regression_files, monkeypatch):
    monkeypatch.chdir(ROOT)  # so tests.common is importable as a factory module
    jsonl, csv_file = regression_files
    config = _write(tmp_path / "run.yaml", f"""
model: tests.common.models:RegressionModel
data:
  train: {jsonl}
  eval: {{path: {csv_file}, columns: [input_x, labels]}}
output_dir: {tmp_path / 'out'}
max_steps: 50
learning_rate: 0.5
per_device_train_batch_size: 8
eval_strategy: steps
eval_steps: 2
use_cpu: true
disable_tqdm: true
report: false
""")
    code, text, err = _run(capsys, "train", config, "--max_steps", 4, "--learning-rate=0.1", "--report_to", "jsonl",
                          "--logging_steps", 2)
    assert code == 0, err
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and [e["step"] for e in state["log_history"] if "eval_loss" in e] == [2, 4]
    assert "evaluation: eval_loss=" in text
    logs = [json.loads(line) for line in open(next((tmp_path / "out" / "runs").iterdir()) / "logs.jsonl")]
    assert [e["step"] for e in logs if "loss" in e] == [2, 4] and logs[0]["learning_rate"] <= 0.1
    assert not (tmp_path / "out" / "report").exists()
    assert (tmp_path / "out" / "live_log.jsonl").is_file()  # `trainwell train` adds report_to "live"


def test_ctrl_c_during_train_writes_the_report_and_says_how_to_resume(tmp_path, capsys, regression_files,
                                                                       monkeypatch):
    """Issue 34: an interrupted run had no report and nothing said how to get one, nor how to resume."""
    from trainwell import Trainer, TrainerCallback

    class CtrlCAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                raise KeyboardInterrupt

    real_train = Trainer.train

    def train_then_ctrl_c(self, *args, **kwargs):
        self.add_callback(CtrlCAt())
        return real_train(self, *args, **kwargs)

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(Trainer, "train", train_then_ctrl_c)
    jsonl, _ = regression_files
    config = _write(tmp_path / "run.yaml", f"model: tests.common.models:RegressionModel\ndata:\n  train: {jsonl}\n"
                                           f"output_dir: {tmp_path / 'out'}\nuse_cpu: true\ndisable_tqdm: true\n")
    code, text, err = _run(capsys, "train", config, "--max_steps", 8, "--save_steps", 3, "--logging_steps", 2)
    assert code == 130, err
    assert (f"interrupted at step 5. To resume from {tmp_path / 'out' / 'checkpoint-3'}, run the same command with "
            "--resume_from_checkpoint auto") in text
    report = tmp_path / "out" / "report"
    assert f"the run report so far: {report / 'index.html'}" in text and (report / "index.html").exists()
    assert "train loss" in (report / "summary.txt").read_text()  # logs at 2 and 4, one after the checkpoint
    assert "(step 4)" in (report / "summary.txt").read_text()


def test_train_on_plain_text_with_the_byte_model_and_print_config(tmp_path, capsys):
    text = _write(tmp_path / "corpus.txt", "the quick brown fox jumps over the lazy dog\n" * 40)
    config = _write(tmp_path / "lm.json", json.dumps({
        "model": {"factory": "trainwell.examples.bytelm:build_model", "kwargs": {"size": "small"}},
        "data": {"train": {"path": str(text), "block_size": 32, "eval_fraction": 0.2}},
        "output_dir": str(tmp_path / "lm"), "max_steps": 2, "use_cpu": True, "disable_tqdm": True,
        "eval_strategy": "steps", "eval_steps": 2,
    }))
    code, text_out, _ = _run(capsys, "train", config, "--print-config", "--model.kwargs.size", "tiny")
    merged = json.loads(text_out)
    assert code == 0 and merged["model"]["kwargs"]["size"] == "tiny" and merged["max_steps"] == 2
    code, text_out, err = _run(capsys, "train", config, "--model.kwargs.size", "tiny")
    assert code == 0, err
    assert "run report:" in text_out and (tmp_path / "lm" / "report" / "index.html").exists()


@pytest.mark.parametrize("body, overrides, expected", [
    ("learning_rat: 0.1\n", [], "unknown config key 'learning_rat'"),
    ("learning_rat: 0.1\n", [], "Did you mean 'learning_rate'?"),
    ("", ["--eval_strategy", "stepz"], "choose one of 'no', 'steps', 'epoch'. Did you mean 'steps'?"),
    ("", ["--max_steps", "many"], "--max_steps many: expected an integer"),
    ("learning_rate: fast\n", [], "learning_rate='fast': pass a number"),
    ("disable_tqdm: maybe\n", [], "disable_tqdm='maybe': pass true or false"),
    ("", ["--modle.factory", "x:y"], "Did you mean 'model'?"),
    ("model: tests.common.models:RegressionModle\n", [], "Did you mean 'RegressionModel'?"),
    ("model: tests.common.models:RegressionModel\ndata: {train: {path: t.jsonl, formt: csv}}\n", [],
     "Did you mean 'format'?"),
    ("model: tests.common.models:RegressionModel\ndata: {train: nowhere.jsonl}\n", [], "no such file"),
    ("- a list\n", [], "must be a mapping"),
    ("report: maybe\n", [], "report='maybe': pass true"),
    ("optim_args: [momentum]\n", [], "optim_args=['momentum']"),
])
def test_config_errors_name_the_key_and_the_fix(tmp_path, capsys, monkeypatch, body, overrides, expected):
    monkeypatch.chdir(ROOT)
    _write(tmp_path / "t.jsonl", '{"input_x": 1.0, "labels": 2.0}\n')
    body = body.replace("t.jsonl", str(tmp_path / "t.jsonl"))
    config = _write(tmp_path / "bad.yaml", body + f"output_dir: {tmp_path / 'o'}\n" if not body.startswith("-")
                    else body)
    code, _, err = _run(capsys, "train", config, *overrides)
    assert code == 2 and expected in err, err


def test_missing_config_file(capsys, tmp_path):
    code, _, err = _run(capsys, "train", tmp_path / "nope.yaml")
    assert code == 2 and "does not exist" in err


# --- report and env ------------------------------------------------------------------------------------------------


def test_report_command_single_and_comparison(tmp_path, capsys):
    fixture = os.path.join(ROOT, "tests", "fixtures", "reference_trainer_state.json")
    runs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        with open(fixture) as src, open(tmp_path / name / "trainer_state.json", "w") as dst:
            dst.write(src.read())
        runs.append(tmp_path / name)
    code, text, _ = _run(capsys, "report", runs[0])
    assert code == 0 and f"report: {tmp_path / 'a' / 'report' / 'index.html'}" in text and "validation loss" in text
    code, text, _ = _run(capsys, "report", *runs, "--out", tmp_path / "cmp")
    assert code == 0 and (tmp_path / "cmp" / "index.html").exists()
    code, _, err = _run(capsys, "report", tmp_path / "missing")
    assert code == 2 and "no trainer_state.json" in err


def test_env_lists_versions_and_devices(capsys):
    code, text, _ = _run(capsys, "env", "--json")
    info = json.loads(text)
    import torch

    assert code == 0 and info["torch"] in (torch.__version__, torch.__version__.split("+")[0])
    assert "cpu" in info["devices"] and "matplotlib" in info["optional"]
    code, text, _ = _run(capsys, "env")
    assert code == 0 and "accelerate" in text and "devices" in text


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    # `trainwell train --print-config | head -1`: the reader is gone before trainwell writes (closed here before
    # the child has even imported trainwell); trainwell must end quietly, not with a traceback
    proc = subprocess.Popen([sys.executable, "-m", "trainwell", "train", "--print-config"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    proc.stdout.close()
    stderr = proc.stderr.read()
    code = proc.wait(timeout=hang_timeout(120))
    assert code == 0 and "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_python_dash_m_and_help():
    done = subprocess.run([sys.executable, "-m", "trainwell", "--help"], capture_output=True, text=True, check=True)
    assert all(cmd in done.stdout for cmd in ("demo", "train", "report", "env"))
    assert main([]) == 2


def test_console_script_imports_a_model_module_beside_the_config(tmp_path):
    """The ``trainwell`` console script finds ``my_model.py`` next to the config (its bin folder, not the
    current directory, starts on sys.path)."""
    script = os.path.join(os.path.dirname(sys.executable), "trainwell")
    if not os.path.exists(script):
        pytest.skip("the trainwell console script is not installed in this environment")
    project = tmp_path / "project"
    project.mkdir()
    _write(project / "my_model.py", """
import torch
from torch import nn

class Line(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(()))

    def forward(self, x, labels=None):
        pred = self.a * x
        return {"loss": ((pred - labels) ** 2).mean(), "logits": pred}

def data():
    return {"train": [{"x": float(i), "labels": 2.0 * i} for i in range(8)]}
""")
    _write(project / "run.yaml", f"""
model: my_model:Line
data: my_model:data
output_dir: {tmp_path / 'out'}
max_steps: 2
use_cpu: true
disable_tqdm: true
report: false
""")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([script, "train", str(project / "run.yaml")], cwd=elsewhere, capture_output=True,
                          text=True, timeout=hang_timeout(300))
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["global_step"] == 2
