"""Distributed evaluation on 2 CPU processes equals a single-process evaluation, to float tolerance.

The datasets do not divide evenly by (batch size × processes): 23 token sequences of different lengths,
23 and 13 regression samples, 3 samples (fewer than one batch per process), an iterable stream of 19, and
``dataloader_drop_last``. ``eval_loss`` included: no duplicated sample enters any mean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.common.timing import hang_timeout
from tests.test_distributed import _accelerate, _cpu_only

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed", "eval_script.py")
pytestmark = pytest.mark.distributed


def _run(cmd: list[str], tmp_path, name: str) -> dict:
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd + ["--out", str(out), "--workdir", str(tmp_path / name)], env=env,
                          capture_output=True, text=True, timeout=hang_timeout(300), check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    _cpu_only()
    tmp = tmp_path_factory.mktemp("eval_dist")
    launch = _accelerate() + ["launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                              "--mixed_precision", "no", "--dynamo_backend", "no", SCRIPT]
    two = _run(launch, tmp, "two")
    one = _run([sys.executable, SCRIPT], tmp, "one")
    assert two["world"] == 2 and one["world"] == 1
    return one, two


@pytest.mark.parametrize("case", ["tokens", "regression", "tiny", "stream", "batch_metrics", "gather_object",
                                  "drop_last"])
def test_metrics_and_eval_loss_match_one_process(results, case):
    one, two = results
    assert set(two[case]) == set(one[case])
    for key, value in one[case].items():
        assert two[case][key] == pytest.approx(value, rel=1e-6, abs=1e-7), key


def test_metrics_cover_exactly_the_dataset(results):
    _, two = results
    assert two["tokens"]["eval_n"] == 23 and two["regression"]["eval_n"] == 23
    assert two["tiny"]["eval_n"] == 3 and two["stream"]["eval_n"] == 19
    assert two["batch_metrics"]["eval_n"] == 23 and two["drop_last"]["eval_n"] == 20


def test_predictions_in_dataset_order(results):
    one, two = results
    np.testing.assert_allclose(two["regression_pred"], one["regression_pred"], rtol=1e-6)
    np.testing.assert_allclose(two["stream_pred"], one["stream_pred"], rtol=1e-6)
    assert two["tokens_pred_shape"] == one["tokens_pred_shape"]
    assert two["tokens_labels"] == one["tokens_labels"]


def test_iterable_training_is_sharded_across_processes(results):
    one, two = results
    assert two["iterable_train"]["epochs"] == [0, 1, 2]
    assert two["iterable_train"]["a"] == pytest.approx(one["iterable_train"]["a"], rel=1e-5)
    assert two["iterable_train"]["b"] == pytest.approx(one["iterable_train"]["b"], rel=1e-5)
