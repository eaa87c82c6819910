"""A run of 8 processes saves, is killed, and resumes at 4 and at 2 processes (the same per-device batch, so a
smaller global batch): every sample of the epoch is trained on exactly once over the interrupted and the resumed
run, checked by sample id. The checkpoint records where it stood in its epoch in samples (``"epoch_samples"``), so
the resumed run continues at the next sample whatever its global batch (``StepPlan.position_of_samples``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.common.launch import ScriptRuns
from tests.common.timing import hang_timeout
from trainwell.loop.plan import StepPlan

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed", "ranks_script.py")
SAMPLES = 96  # 8 processes x 2 = 16 a step: 6 steps; checkpoints every 2 steps, killed as step 5 ends


def trained_ids(record: Path, tag: str, up_to: int | None = None) -> list[int]:
    """The sample ids every process of run ``tag`` trained on (in the steps up to ``up_to``)."""
    ids = []
    for path in sorted(record.glob(f"ids_{tag}_rank*.jsonl")):
        for line in path.read_text().splitlines():
            step = json.loads(line)
            if up_to is None or step["step"] <= up_to:
                ids += step["ids"]
    return ids


def assert_epoch_once(ids: list[int]) -> None:
    counts = Counter(ids)
    twice = sorted(i for i, n in counts.items() if n > 1)
    skipped = sorted(set(range(SAMPLES)) - set(counts))
    assert not twice and not skipped, f"seen twice: {twice}; skipped: {skipped}"


@pytest.fixture(scope="module")
def killed_at_eight(tmp_path_factory):
    """The 8-process run, killed as step 5 ends (checkpoint-4 is its newest: 64 samples of 96 used)."""
    root = tmp_path_factory.mktemp("ranks")
    runs = ScriptRuns(SCRIPT, root)
    runs("eight", 8, "--record", str(root / "record"), "--tag", "eight", "--kill-at", "5", killed=True)
    assert sorted(p.name for p in runs.workdir("eight").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    return runs


@pytest.mark.distributed
@pytest.mark.parametrize("processes", [8, 4, 2])
def test_eight_processes_killed_resume_at_eight_or_fewer_with_every_sample_once(killed_at_eight, processes):
    runs, record = killed_at_eight, killed_at_eight.root / "record"
    shutil.copytree(runs.workdir("eight"), runs.workdir(f"at{processes}"))  # its own copy of the run folder
    checkpoint = runs.workdir(f"at{processes}") / "checkpoint-4"
    result = runs(f"at{processes}", processes, "--record", str(record), "--tag", f"at{processes}", "--resume",
                  str(checkpoint))
    assert "was trained with" not in result["log"]  # continued exactly: nothing to warn about
    assert result["step"] == 4 + (SAMPLES - 64) // (processes * 2) and result["epoch"] == 1.0
    before, after = trained_ids(record, "eight", up_to=4), trained_ids(record, f"at{processes}")
    assert len(before) == 64 and len(after) == SAMPLES - 64
    assert_epoch_once(before + after)


def test_a_resume_with_a_smaller_global_batch_continues_at_the_next_sample(tmp_path):
    """One process: batch 4 saves at step 2 (8 samples used), a resume with batch 2 trains on the other 88 once."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    record = tmp_path / "record"

    def run(tag: str, workdir: Path, *flags: str) -> str:
        proc = subprocess.run([sys.executable, SCRIPT, "--workdir", str(workdir), "--record", str(record), "--tag",
                               tag, "--save-steps", "2", *flags], env=env, capture_output=True, text=True,
                              timeout=hang_timeout(300))
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc.stderr

    run("first", tmp_path / "first", "--batch", "4")
    log = run("resumed", tmp_path / "resumed", "--batch", "2", "--resume", str(tmp_path / "first" / "checkpoint-2"))
    assert "was trained with" not in log
    assert_epoch_once(trained_ids(record, "first", up_to=2) + trained_ids(record, "resumed"))


def test_the_position_of_a_checkpoint_in_samples_is_the_plans_arithmetic():
    plan = StepPlan(1, 12, 96, 96.0, 8, 24, 12, accumulation=2)  # 8 samples a step: 2 micro-batches of 4
    assert plan.position_of_samples(0, 64) == (0, 8)  # 64 samples of a run of 16 a step: 8 steps of this one
    assert plan.position_of_samples(0, 60) is None  # not on a step of this run: the step count decides
    assert plan.position_of_samples(2, 96) == (3, 0)  # the epoch was used up
    assert plan.position_of_samples(0, 0) == (0, 0)
