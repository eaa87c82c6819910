"""Progress in a notebook (``trainwell.events.notebook``): an HTML bar and a metrics table updated in place through
``IPython.display``, chosen by the Trainer when it runs in a notebook kernel. IPython is faked here: a module whose
``display(..., display_id=True)`` hands back a handle that records what each output area shows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.common.timing import hang_timeout
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.events import notebook
from trainwell.events.notebook import NotebookProgressCallback, in_notebook

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAKE_IPYTHON = '''
import sys, types

class HTML:
    def __init__(self, data):
        self.data = data

class Handle:
    def __init__(self, shown):
        self.shown = [shown]
    def update(self, obj):
        self.shown.append(obj.data)

AREAS = []

def display(obj, display_id=None):
    assert display_id is True  # updated in place later
    AREAS.append(Handle(obj.data))
    return AREAS[-1]

class Shell:
    def __init__(self, config):
        self.config = config

def install(kernel=True):
    ipython = types.ModuleType("IPython")
    shown = types.ModuleType("IPython.display")
    shown.HTML, shown.display, shown.AREAS = HTML, display, AREAS
    ipython.display = shown
    shell = Shell({"IPKernelApp": {"connection_file": "kernel.json"}} if kernel else {"TerminalIPythonApp": {}})
    ipython.get_ipython = lambda: shell
    sys.modules["IPython"], sys.modules["IPython.display"] = ipython, shown
    return shown
'''


@pytest.fixture
def ipython(monkeypatch):
    """A fake IPython kernel; its ``display.AREAS`` are the output areas drawn, each with what it showed, in order."""
    fake = types.ModuleType("fake_ipython")
    exec(FAKE_IPYTHON, fake.__dict__)
    for name in ("IPython", "IPython.display"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    shown = fake.install()
    monkeypatch.setattr(notebook.NotebookProgressBar, "update_every", 0.0)  # draw every update
    yield shown
    for name in ("IPython", "IPython.display"):
        sys.modules.pop(name, None)


def _trainer(out_dir, **kwargs):
    args = make_args(out_dir, max_steps=4, per_device_train_batch_size=8, logging_steps=1, **kwargs)
    return Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32),
                   eval_dataset=RegressionDataset(length=16), callbacks=[NotebookProgressCallback()],
                   compute_metrics=lambda p: {"mae": float(abs(p.predictions - p.label_ids).mean())})


def _rows(html: str) -> list[list[str]]:
    return [re.findall(r"<t[hd]>(.*?)</t[hd]>", row) for row in re.findall(r"<tr.*?>(.*?)</tr>", html)]


def test_in_notebook_means_an_ipython_kernel_or_marimo(monkeypatch, ipython):
    assert in_notebook()
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "10.4")  # no IPython kernel there before 11.0
    assert not in_notebook()
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "13.3")
    assert in_notebook()
    sys.modules["IPython"].get_ipython = lambda: type("Shell", (), {"config": {"TerminalIPythonApp": {}}})()
    assert not in_notebook()  # an IPython shell in a terminal: tqdm's bar works there
    sys.modules["IPython"].get_ipython = lambda: None
    assert not in_notebook()
    monkeypatch.setitem(sys.modules, "marimo", types.ModuleType("marimo"))
    assert in_notebook()


def test_training_draws_one_area_with_the_bar_and_a_row_per_evaluation(out_dir, ipython):
    trainer = _trainer(out_dir, eval_strategy="steps", eval_steps=2)
    trainer.train()
    assert len(ipython.AREAS) == 1  # everything updated in place
    shown = ipython.AREAS[0].shown
    final = shown[-1]
    assert "<progress value='4' max='4'" in final and "Epoch 1/1" in final
    rows = _rows(final)
    assert rows[0] == ["Step", "Training Loss", "Validation Loss", "Mae"]
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    assert rows[1:] == [[str(e["step"]), f"{losses[e['step']]:.6f}", f"{e['eval_loss']:.6f}", f"{e['eval_mae']:.6f}"]
                        for e in evals]
    assert any("<progress value='1' max='2'" in html for html in shown)  # the evaluation's bar, under the table
    assert "max='2'" not in final  # and gone once it finished


def test_without_evaluation_each_logged_loss_is_a_row(out_dir, ipython):
    trainer = _trainer(out_dir)
    trainer.train()
    rows = _rows(ipython.AREAS[0].shown[-1])
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert rows == [["Step", "Training Loss"], *[[str(i + 1), f"{loss:.6f}"] for i, loss in enumerate(losses)]]


def test_evaluate_alone_shows_its_metrics_and_returns_them_untouched(out_dir, ipython):
    trainer = _trainer(out_dir)
    metrics = trainer.evaluate()
    assert "eval_runtime" in metrics and "eval_samples_per_second" in metrics  # the reference pops them
    table = _rows(ipython.AREAS[-1].shown[-1])
    assert table[0] == ["Step", "Training Loss", "Validation Loss", "Mae"]
    assert table[1] == ["0", "No log", f"{metrics['eval_loss']:.6f}", f"{metrics['eval_mae']:.6f}"]
    trainer.predict(RegressionDataset(length=16))  # its bar is closed (emptied) at the end
    assert ipython.AREAS[-1].shown[-1] == ""


CHOICE = FAKE_IPYTHON + '''
install(kernel=sys.argv[1] == "kernel")
from tests.common.models import RegressionModel
from trainwell import Trainer, TrainingArguments
from trainwell.utils.notebook import NotebookProgressCallback
import trainwell.events.notebook as owner
assert NotebookProgressCallback is owner.NotebookProgressCallback
for quiet in (False, True):
    args = TrainingArguments(output_dir=sys.argv[2] + str(quiet), use_cpu=True, report_to="none", disable_tqdm=quiet)
    trainer = Trainer(model=RegressionModel(), args=args)
    print(sorted(type(c).__name__ for c in trainer.callback_handler.callbacks if "Callback" in type(c).__name__))
'''


@pytest.mark.parametrize("shell,progress", [("kernel", "NotebookProgressCallback"),
                                            ("terminal", "ProgressCallback")])
def test_the_trainer_chooses_the_notebook_display_in_a_kernel(tmp_path, shell, progress):
    done = subprocess.run([sys.executable, "-c", CHOICE, shell, str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=hang_timeout(300), cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    with_bar, quiet = done.stdout.strip().splitlines()[-2:]
    assert with_bar == str(["DefaultFlowCallback", progress])
    assert quiet == str(["DefaultFlowCallback", "PrinterCallback"])  # disable_tqdm: plain lines, as the reference
