"""Config files that would hurt (issue 26): YAML aliases bounded before anything expands them (a 454-byte "billion
laughs" took 8.2 GB and 77 s), a circular alias named by file and key, and callables a config may not name
(``compute_metrics: os:system`` passed the start-up checks)."""

from __future__ import annotations

import json
import os
import resource
import time

import pytest

from tests.common.cli import run_cli
from trainwell.utils.safe_yaml import MAX_VALUES, YamlError, expanded_size, load_yaml

yaml = pytest.importorskip("yaml")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def billion_laughs(levels: int = 9) -> str:
    """Nine levels of nine aliases each: 9**9 (387 million) strings from a few hundred bytes."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for previous, name in zip("abcdefghi", "bcdefghij"[: levels - 1]):
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # tests.common is importable as a factory module
    (tmp_path / "train.jsonl").write_text(
        "".join(json.dumps({"input_x": x / 4, "labels": x / 2}) + "\n" for x in range(8))
    )
    (tmp_path / "metrics.py").write_text(
        "import os\n"
        "def accuracy(eval_pred):\n    return {'acc': 1.0}\n"
        "def batched(eval_pred, compute_result):\n    return {'acc': 1.0}\n"
        "def two(y_true, y_pred):\n    return {}\n"
        "class Metrics:\n    def __init__(self, scale=1.0):\n        self.scale = scale\n"
        "    def __call__(self, eval_pred):\n        return {'acc': self.scale}\n"
        "def make(scale=1.0):\n    return Metrics(scale)\n"
        "def make_wrong():\n    return 'not a function'\n"
        "system = os.system\n"
    )
    return tmp_path


def _config(folder, body: str) -> str:
    path = folder / "run.yaml"
    path.write_text(
        f"model: tests.common.models:RegressionModel\ndata: {{train: {folder / 'train.jsonl'}}}\n"
        f"output_dir: {folder / 'out'}\nmax_steps: 1\nuse_cpu: true\ndisable_tqdm: true\n"
        f"report: false\nreport_to: none\n" + body
    )
    return str(path)


# --- aliases -------------------------------------------------------------------------------------------------------


def test_a_billion_laughs_config_is_refused_at_once_naming_the_file(project, capsys):
    text = billion_laughs()
    assert len(text) < 460
    config = project / "lol.yaml"
    config.write_text("output_dir: x\n" + text)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    code, _, err = run_cli(capsys, "train", config)
    elapsed = time.perf_counter() - start
    assert code == 2 and err.startswith(
        f"trainwell train: error: {config}: its aliases (*name) expand to more than {MAX_VALUES:,} values"
    ), err
    assert "billion laughs" in err and len(err.splitlines()) == 2
    # Refused from the node graph, before a single alias is expanded: no time, no memory (kB on Linux).
    assert elapsed < 10 and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 200_000


@pytest.mark.parametrize(
    "body, key, target",
    [
        ("model:\n  factory: m:f\n  kwargs: &k\n    inner: *k\n", "model.kwargs.inner", "model.kwargs"),
        ("report_to: &r [tensorboard, *r]\n", "report_to[1]", "report_to"),
        ("data: &d {train: *d}\n", "data.train", "data"),
    ],
)
def test_a_circular_alias_names_the_file_and_the_key(project, capsys, body, key, target):
    config = project / "circular.yaml"
    config.write_text("output_dir: x\n" + body)
    code, _, err = run_cli(capsys, "train", config)
    assert code == 2 and f"{config}: the alias at {key!r} refers to the value of {target!r}" in err, err
    assert "circular reference" in err and "Traceback" not in err


def test_a_document_that_is_its_own_alias():
    with pytest.raises(YamlError, match="refers to the whole document"):
        load_yaml("&top [1, *top]\n", "top.yaml")


def test_ordinary_aliases_and_merge_keys_still_work(project, capsys):
    text = "base: &base\n  learning_rate: 0.25\n  seed: 3\nrun:\n  <<: *base\n  seed: 4\nlists: [&one 1, *one, *one]\n"
    assert load_yaml(text, "x.yaml") == {
        "base": {"learning_rate": 0.25, "seed": 3},
        "run": {"learning_rate": 0.25, "seed": 4},
        "lists": [1, 1, 1],
    }
    config = _config(project, "learning_rate: &lr 0.125\nweight_decay: *lr\n")
    code, out, err = run_cli(capsys, "train", config, "--print-config")
    assert code == 0, err
    merged = json.loads(out)
    assert merged["learning_rate"] == 0.125 and merged["weight_decay"] == 0.125


def _expanded(data) -> int:
    """Values in ``data`` with every shared object counted where it appears (what a JSON round trip writes)."""
    if isinstance(data, dict):
        return 1 + sum(1 + _expanded(v) for v in data.values())
    if isinstance(data, list):
        return 1 + sum(_expanded(v) for v in data)
    return 1


def test_the_count_is_that_of_the_expanded_document_and_needs_no_deep_stack():
    text = billion_laughs(levels=5)
    expected = 1 + 5 + 10 + 91 + 820 + 7381 + 66430  # the mapping, its keys, then each level: 1 + 9 x the one before
    assert expanded_size(yaml.compose(text), "x") == expected == _expanded(yaml.safe_load(text))
    with pytest.raises(YamlError, match="more than 74,737 values"):
        expanded_size(yaml.compose(text), "x", max_values=expected - 1)
    node = yaml.ScalarNode("tag:yaml.org,2002:int", "1")
    for _ in range(20_000):  # deeper than Python's recursion limit
        node = yaml.SequenceNode("tag:yaml.org,2002:seq", [node])
    assert expanded_size(node, "deep.yaml") == 20_001


def test_an_alias_bomb_in_a_command_line_override_is_refused(project, capsys):
    config = _config(project, "")
    bomb = "{" + billion_laughs().replace("\n", ", ").rstrip(", ") + "}"
    code, _, err = run_cli(capsys, "train", config, "--model.kwargs", bomb)
    assert code == 2 and "error: --model.kwargs: its aliases (*name) expand to more than" in err, err


def test_the_argument_parser_reads_yaml_the_same_way(tmp_path):
    from trainwell import TrainingArguments
    from trainwell.args.parser import TrainwellArgumentParser

    path = tmp_path / "args.yaml"
    path.write_text("output_dir: x\n" + billion_laughs())
    with pytest.raises(ValueError, match="args.yaml: its aliases"):
        TrainwellArgumentParser(TrainingArguments).parse_yaml_file(path)


# --- callables -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ("os:system", "'os:system' is posix.system, which runs programs"),
        ("subprocess:run", "'subprocess:run' is subprocess.run, which runs programs"),
        ("builtins:eval", "'builtins:eval' is builtins.eval"),
        ("./metrics.py:system", "is posix.system, which runs programs"),  # re-exported: its origin counts
        ("json:loads", "'json:loads' is json.loads, from Python's standard library, not a metrics function"),
        ("operator:itemgetter", "from Python's standard library"),
        ("./metrics.py:two", "takes (y_true, y_pred), but a metrics function is called with one EvalPrediction"),
        ("./metrics.py:Metrics", "is a class: calling it with an EvalPrediction would build an object"),
        ("./metrics.py:os", "is a module, not a function"),
        ("os:sep", "is a str, not a function"),
        ("{factory: os:system, kwargs: {command: touch PWNED}}", "'os:system' is posix.system"),
        ("{factory: ./metrics.py:make_wrong}", "is a str, not a function"),
    ],
)
def test_compute_metrics_must_be_a_metrics_function(project, capsys, value, expected):
    config = _config(project, f"compute_metrics: {value}\n")
    code, _, err = run_cli(capsys, "train", config)
    assert code == 2 and err.startswith("trainwell train: error: compute_metrics: "), err
    assert expected in err and "Traceback" not in err, err
    assert not (project / "PWNED").exists() and not os.path.exists(os.path.join(ROOT, "PWNED"))


@pytest.mark.parametrize(
    "value", ["./metrics.py:accuracy", "./metrics.py:batched", "{factory: ./metrics.py:make, kwargs: {scale: 2.0}}"]
)
def test_a_metrics_function_of_ones_own_is_accepted(project, capsys, value):
    config = _config(project, f"compute_metrics: {value}\neval_strategy: 'no'\n")
    code, _, err = run_cli(capsys, "train", config)
    assert code == 0, err


def test_no_factory_may_run_programs(project, capsys):
    config = _config(project, "")
    text = (
        open(config)
        .read()
        .replace(
            "model: tests.common.models:RegressionModel",
            "model: {factory: subprocess:getoutput, kwargs: {cmd: touch PWNED}}",
        )
    )
    open(config, "w").write(text)
    code, _, err = run_cli(capsys, "train", config)
    assert code == 2 and "model: 'subprocess:getoutput' is subprocess.getoutput, which runs programs" in err, err
    assert not os.path.exists(os.path.join(ROOT, "PWNED"))
