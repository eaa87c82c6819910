"""``trainwell train`` as a person meets it (issue 14): relative paths, factory keyword arguments checked against
the factory, ``--print-config`` without a config (a template), and what a bare ``trainwell train`` says."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import yaml

from tests.common.cli import run_cli
from trainwell.cli import build, main
from trainwell.cli.config import TEMPLATE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = "".join(json.dumps({"input_x": x / 4, "labels": x / 2 + 1}) + "\n" for x in range(-8, 8))


_run = run_cli


@pytest.fixture
def project(tmp_path, monkeypatch):
    """``project/configs/run.yaml`` with ``project/configs/data/train.jsonl``; the current directory is elsewhere
    (ROOT, so ``tests.common`` imports)."""
    configs = tmp_path / "project" / "configs"
    (configs / "data").mkdir(parents=True)
    (configs / "data" / "train.jsonl").write_text(ROWS)
    monkeypatch.chdir(ROOT)
    return configs


def _config(folder, data: str, **extra) -> str:
    body = {"model": "tests.common.models:RegressionModel", "data": yaml.safe_load(data),
            "output_dir": str(folder.parent / "out"), "max_steps": 1, "use_cpu": True, "disable_tqdm": True,
            "report": False, **extra}
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


# --- relative paths ------------------------------------------------------------------------------------------------


def test_relative_data_paths_resolve_against_the_config_folder(project, capsys):
    config = _config(project, "{train: data/train.jsonl, eval: {path: data/train.jsonl, limit: 4}}")
    code, out, err = _run(capsys, "train", config, "--print-config")
    assert code == 0, err
    merged = json.loads(out)
    assert merged["data"]["train"] == str(project / "data" / "train.jsonl")
    assert merged["data"]["eval"]["path"] == str(project / "data" / "train.jsonl")
    code, out, err = _run(capsys, "train", config)
    assert code == 0, err
    assert json.loads((project.parent / "out" / "trainer_state.json").read_text())["global_step"] == 1


def test_absolute_paths_are_unchanged_and_overrides_resolve_against_the_current_directory(project, capsys, tmp_path,
                                                                                           monkeypatch):
    absolute = str(project / "data" / "train.jsonl")
    config = _config(project, f"{{train: {absolute}}}")
    code, out, _ = _run(capsys, "train", config, "--print-config")
    assert code == 0 and json.loads(out)["data"]["train"] == absolute
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here.jsonl").write_text(ROWS)
    code, out, _ = _run(capsys, "train", config, "--print-config", "--data.train", "here.jsonl")
    assert code == 0 and json.loads(out)["data"]["train"] == str(tmp_path / "here.jsonl")


def test_a_missing_file_says_where_it_looked(project, capsys, tmp_path, monkeypatch):
    config = _config(project, "{train: data/nope.jsonl}")
    code, _, err = _run(capsys, "train", config)
    assert code == 2 and "data.train: no such file 'data/nope.jsonl'" in err
    assert f"looked for {project / 'data' / 'nope.jsonl'}" in err
    assert f"relative to the config's folder, {project})" in err
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "train", config, "--data.train", "gone.jsonl")
    assert code == 2 and f"looked for {tmp_path / 'gone.jsonl'}" in err and "current directory" in err


def test_a_json_config_file_field_resolves_against_the_config_folder(project, capsys):
    (project / "accelerate.json").write_text(json.dumps({"split_batches": True}))
    config = _config(project, "{train: data/train.jsonl}", accelerator_config="accelerate.json")
    code, out, err = _run(capsys, "train", config, "--print-config")
    assert code == 0, err
    assert json.loads(out)["accelerator_config"]["split_batches"] is True


def test_a_dotted_override_below_a_string_path_turns_it_into_a_mapping(project, capsys):
    rows = "".join(f"{x / 4},{x / 2 + 1}\n" for x in range(-8, 8))
    (project / "data" / "train.txt").write_text("input_x,labels\n" + rows)  # CSV under a .txt name
    config = _config(project, "{train: data/train.txt}")
    code, out, err = _run(capsys, "train", config, "--print-config", "--data.train.format", "csv")
    assert code == 0, err
    assert json.loads(out)["data"]["train"] == {"path": str(project / "data" / "train.txt"), "format": "csv"}
    code, _, err = _run(capsys, "train", config, "--data.train.format", "csv")
    assert code == 0, err  # read as CSV rows; as a text file it would be byte blocks the model cannot take
    assert json.loads((project.parent / "out" / "trainer_state.json").read_text())["global_step"] == 1


def test_a_dotted_override_below_a_plain_value_says_how_to_write_it(project, capsys):
    config = _config(project, "{train: data/train.jsonl}")
    code, _, err = _run(capsys, "train", config, "--max_steps.x", "1")
    assert code == 2 and "--max_steps.x: 'max_steps' is 1 in the config, not a mapping" in err
    assert "Override the whole value (--max_steps VALUE)" in err


# --- factory keyword arguments -------------------------------------------------------------------------------------

FACTORIES = """
import torch

BUILT = []


def build(hidden: int, layers: int = 2):
    BUILT.append(hidden)
    return torch.nn.Linear(hidden, layers)


def rows(path, limit=4):
    return [{"x": 0.0, "labels": 0.0}] * limit


def anything(**kwargs):
    return torch.nn.Linear(1, 1)
"""


@pytest.mark.parametrize("model, data, expected", [
    ("{factory: './factories.py:build', kwargs: {hiden: 32}}", "data/train.jsonl",
     ["model.kwargs: ./factories.py:build has no parameter 'hiden'", "it takes: hidden, layers=2",
      "Did you mean 'hidden'?"]),
    ("{factory: './factories.py:build', kwargs: {layers: 3}}", "data/train.jsonl",
     ["model: ./factories.py:build needs 'hidden'", "model.kwargs"]),
    ("./factories.py:build", "data/train.jsonl", ["model: ./factories.py:build needs 'hidden'"]),
    ("{factory: './factories.py:build', kwargs: {hidden: 4}}", "{factory: './factories.py:rows', kwargs: {lmit: 2}}",
     ["data.kwargs: ./factories.py:rows has no parameter 'lmit'", "Did you mean 'limit'?"]),
])
def test_factory_kwargs_are_checked_before_anything_is_built(project, capsys, model, data, expected):
    (project / "factories.py").write_text(FACTORIES)
    config = _config(project, "{}")
    text = (project / "run.yaml").read_text().replace("data: {}", f"data: {data}")
    (project / "run.yaml").write_text(text.replace("RegressionModel", "X").replace(
        "model: tests.common.models:X", f"model: {model}"))
    code, _, err = _run(capsys, "train", config)
    assert code == 2 and all(e in err for e in expected), err
    with build.factory_folders(config):
        assert build.import_object("./factories.py:BUILT", "test") == []  # the model factory never ran


def test_a_factory_taking_var_kwargs_accepts_any_keyword(tmp_path):
    (tmp_path / "factories.py").write_text(FACTORIES)
    with build.factory_folders(str(tmp_path / "run.yaml")):
        made = build.call_factory({"factory": "./factories.py:anything", "kwargs": {"whatever": 1}}, "model", True)
    assert made.in_features == 1


# --- --print-config without a config, and a bare `trainwell train` -------------------------------------------------


def test_print_config_without_a_config_prints_a_commented_template(project, capsys):
    code, out, err = _run(capsys, "train", "--print-config")
    assert code == 0, err
    assert out == TEMPLATE and "# model:" in out and "# data:" in out and "# TrainingArguments" in out
    filled = out.replace("mypackage.models:build_model", "tests.common.models:RegressionModel")
    (project / "run.yaml").write_text(filled)
    code, out, err = _run(capsys, "train", project / "run.yaml", "--output_dir", project.parent / "out",
                          "--max_steps", 1, "--use_cpu", "--disable_tqdm", "--report", "false")
    assert code == 0, err
    assert json.loads((project.parent / "out" / "trainer_state.json").read_text())["global_step"] == 1


def test_the_template_shows_the_training_arguments_defaults():
    from trainwell.cli.config import SECTIONS
    from trainwell.training_args import TrainingArguments

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    shown = yaml.safe_load(TEMPLATE)
    for key, value in shown.items():
        if key in defaults and key not in SECTIONS and key != "output_dir":
            assert value == (defaults[key].value if hasattr(defaults[key], "value") else defaults[key]), key


def test_train_without_arguments_says_overrides_are_optional(capsys):
    code, _, err = _run(capsys, "train")
    assert code == 2 and "required" not in err
    assert "no config file given" in err and "trainwell train CONFIG.yaml" in err and "optional" in err
    with pytest.raises(SystemExit):
        main(["train", "--max_steps", "3"])
    assert "The config file comes first, then the optional overrides" in capsys.readouterr().err
