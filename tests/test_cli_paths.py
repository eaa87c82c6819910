"""``trainwell train`` imports only the factory modules a config names (issue 15, item 4).

A file beside the config or in the current directory that shares its name with an installed or standard-library
module (``html.py``, ``json.py``, ``accelerate.py``, ...) is never imported; modules the config names are found
there (with their sibling modules) when they are not importable otherwise; an importable module wins over a
same-named local file, with a warning, and a path reference (``./json.py:loads``) loads the local file under a
private name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.common.timing import hang_timeout
from trainwell.cli import build, main

LOCAL_MODULES = ("mymodels", "helpers", "mylib", "cwd_models")
SHADOWS = ("html", "json", "accelerate", "torch", "matplotlib", "safetensors", "csv")

MODEL_MODULE = """
import torch
from torch import nn

from helpers import SCALE  # a sibling module, imported while this module loads


class Line(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(()))

    def forward(self, x, labels=None):
        pred = self.a * x * SCALE
        return {"loss": ((pred - labels) ** 2).mean(), "logits": pred}


def data():
    from helpers import rows  # a sibling module imported only when the factory runs

    return {"train": rows(8), "eval": rows(4)}


class Rows(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": float(i), "labels": 2.0 * i}


def worker_data():
    return {"train": Rows(8)}


def collate(features):
    from helpers import stack  # imported during training, in a DataLoader worker

    return stack(features)
"""

HELPERS = """
SCALE = 1.0


def rows(n):
    return [{"x": float(i), "labels": 2.0 * i} for i in range(n)]


def stack(features):
    import torch

    return {k: torch.tensor([f[k] for f in features]) for k in features[0]}
"""


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _shadow(folder, name, markers):
    """``folder/name.py`` that leaves a marker file when it is imported (and does nothing else)."""
    return _write(folder / f"{name}.py", f"import os\nopen(os.path.join({str(markers)!r}, "
                                         f"{name!r} + '-' + {folder.name!r}), 'w').close()\n")


def _markers(markers):
    return sorted(p.name for p in markers.iterdir())


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def project(tmp_path):
    """A config folder with ``mymodels.py`` + ``helpers.py``, a separate working directory, and a marker folder."""
    markers = tmp_path / "markers"
    markers.mkdir()
    config_dir, workdir = tmp_path / "project", tmp_path / "workdir"
    _write(config_dir / "mymodels.py", MODEL_MODULE)
    _write(config_dir / "helpers.py", HELPERS)
    workdir.mkdir()
    yield config_dir, workdir, markers
    for name in [n for n in sys.modules if n.partition(".")[0] in LOCAL_MODULES]:
        del sys.modules[name]  # the next test's folder has its own modules of these names


def _config(config_dir, out, **values):
    """``config_dir/run.yaml``: a 2-step CPU run of ``mymodels``' model and data, with ``values`` on top."""
    values = {"model": "mymodels:Line", "data": "mymodels:data", "output_dir": str(out), "max_steps": 2,
              "use_cpu": True, "disable_tqdm": True, "report_to": "none", **values}
    return _write(config_dir / "run.yaml", "".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()))


def test_a_real_run_never_imports_files_that_shadow_installed_modules(project, tmp_path):
    """The console script, run from a folder holding its own shadows: the model and data come from the named
    ``mymodels.py`` (and its sibling ``helpers.py``); none of the shadows beside the config or in the current
    directory is imported, through training, evaluation, saving and the report (html, matplotlib)."""
    config_dir, workdir, markers = project
    for folder in (config_dir, workdir):
        for name in SHADOWS:
            _shadow(folder, name, markers)
    config = _config(config_dir, tmp_path / "out", report=True, eval_strategy="steps", eval_steps=1)
    script = os.path.join(os.path.dirname(sys.executable), "trainwell")
    command = [script] if os.path.exists(script) else [
        sys.executable, "-P", "-c", "import sys; from trainwell.cli import main; sys.exit(main())"]
    done = subprocess.run([*command, "train", str(config)], cwd=workdir, capture_output=True, text=True,
                          timeout=hang_timeout(300))
    assert done.returncode == 0, done.stderr[-3000:]
    assert _markers(markers) == [], done.stderr[-3000:]
    assert "warning" not in done.stderr
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["global_step"] == 2
    assert (tmp_path / "out" / "report" / "index.html").exists()


def test_named_modules_and_their_siblings_import_and_sys_path_is_left_alone(project, tmp_path, capsys,
                                                                           monkeypatch):
    config_dir, workdir, markers = project
    _write(config_dir / "mylib" / "__init__.py", "")
    _write(config_dir / "mylib" / "collate.py", "from .parts import stack\n")
    _write(config_dir / "mylib" / "parts.py", "from trainwell import default_data_collator as stack\n")
    for name in ("xml", "email"):  # standard-library packages not imported yet in most processes
        _shadow(config_dir, name, markers)
    monkeypatch.chdir(workdir)
    path_before = list(sys.path)
    config = _config(config_dir, tmp_path / "out", report=False, data_collator="mylib.collate:stack")
    code, text, err = _run(capsys, "train", config)
    assert code == 0, err
    assert "trained 2 steps" in text and "warning" not in err
    assert sys.path == path_before
    assert _markers(markers) == []
    assert sys.modules["mymodels"].__file__ == str(config_dir / "mymodels.py")


def test_dataloader_workers_started_with_spawn_import_local_modules(project, tmp_path, capsys, monkeypatch):
    """A Dataset class and a collator from ``mymodels.py`` reach DataLoader workers started with ``spawn`` (the
    default on macOS and Windows), which import the module again by name, and the collator's deferred import of
    ``helpers`` works there; ``sys.path`` is as before once the run returns."""
    config_dir, workdir, _ = project
    monkeypatch.chdir(workdir)
    path_before = list(sys.path)
    config = _config(config_dir, tmp_path / "out", report=False, data_collator="mymodels:collate",
                     data="mymodels:worker_data", dataloader_num_workers=1,
                     dataloader_multiprocessing_context="spawn", max_steps=1)
    code, text, err = _run(capsys, "train", config)
    assert code == 0 and "trained 1 steps" in text, err
    assert sys.path == path_before


def test_factories_in_the_current_directory_are_found(project, tmp_path, capsys, monkeypatch):
    config_dir, workdir, _ = project
    (config_dir / "mymodels.py").rename(workdir / "cwd_models.py")
    (config_dir / "helpers.py").rename(workdir / "helpers.py")
    monkeypatch.chdir(workdir)
    config = _config(config_dir, tmp_path / "out", report=False, model="cwd_models:Line", data="cwd_models:data")
    code, text, err = _run(capsys, "train", config)
    assert code == 0 and "trained 2 steps" in text, err


def test_a_named_module_that_collides_with_an_installed_one(project, tmp_path, capsys, monkeypatch):
    """``json:loads`` with a ``json.py`` beside the config: the installed module wins, with a warning naming
    both; ``./json.py:loads`` runs the local file, under a private name, leaving ``sys.modules['json']`` alone."""
    config_dir, workdir, markers = project
    _shadow(config_dir, "json", markers)
    with open(config_dir / "json.py", "a") as f:
        f.write("def loads(s):\n    return {'train': [{'x': 1.0, 'labels': 2.0}] * 4}\n")
    monkeypatch.chdir(workdir)
    rows = json.dumps({"train": [{"x": float(i), "labels": 2.0 * i} for i in range(8)]})
    config = _config(config_dir, tmp_path / "out", report=False, data={"factory": "json:loads", "kwargs": {"s": rows}})

    code, _, err = _run(capsys, "train", config)
    assert code == 0, err
    assert _markers(markers) == []
    assert "warning: data: 'json' is the importable module" in err and str(config_dir / "json.py") in err
    assert "'./json.py:loads'" in err

    _config(config_dir, tmp_path / "out", report=False, data={"factory": "./json.py:loads", "kwargs": {"s": rows}})
    stdlib_json = sys.modules["json"]
    code, _, err = _run(capsys, "train", config)
    assert code == 0, err
    assert _markers(markers) == ["json-project"] and "warning" not in err
    assert sys.modules["json"] is stdlib_json
    with build.factory_folders(str(config)):
        loads = build.import_object("./json.py:loads", "data")
    assert loads.__module__.startswith("_trainwell_file_json_") and loads("") == {"train": [{"x": 1.0,
                                                                                              "labels": 2.0}] * 4}


@pytest.mark.parametrize("reference, expected", [
    ("nowhere_module:build", "cannot import module 'nowhere_module'"),
    ("./missing.py:build", "no such file './missing.py'"),
    ("mymodels:dta", "Did you mean 'data'?"),
])
def test_unresolved_references_name_where_they_were_looked_up(project, tmp_path, capsys, monkeypatch,
                                                              reference, expected):
    config_dir, workdir, _ = project
    monkeypatch.chdir(workdir)
    path_before = list(sys.path)
    config = _config(config_dir, tmp_path / "out", report=False, model=reference)
    code, _, err = _run(capsys, "train", config)
    assert code == 2 and expected in err, err
    if "nowhere" in reference:
        assert str(config_dir) in err and str(workdir) in err
    assert sys.path == path_before
