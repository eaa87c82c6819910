"""benchmarks/short_run.py keeps working: its smoke run prints every runner's whole run and time to the first step
with the ratio to the loop, and ``--explain`` lists the fixed costs."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

from tests.common.timing import hang_timeout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "short_run.py")


def test_smoke_prints_each_runner_with_its_ratio_to_the_loop(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    markdown = tmp_path / "table.md"
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--explain", "5", "--markdown", str(markdown)],
                          capture_output=True, text=True, env=env, timeout=hang_timeout(600))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    runners = ["loop", "trainwell"] + (["transformers"] if importlib.util.find_spec("transformers") else [])
    for clock in ("process CPU time:", "wall time:"):
        table = out.split(clock, 1)[1].split("\n\n", 1)[0]
        for runner in runners:
            row = next(line for line in table.splitlines() if line.startswith(runner))
            numbers = re.findall(r"\d+\.\d+x?", row[22:])  # after the name (the reference's holds a version)
            assert len(numbers) == 6, row  # whole run, ratio, to the first step, ratio, set-up, finish
            assert float(numbers[0]) > 0 and numbers[1].endswith("x") and numbers[3].endswith("x"), row
    rows = markdown.read_text().splitlines()
    names = [row.split(" | ")[1].rsplit(": ", 1)[1] for row in rows]
    assert [name.split()[0] for name in names] == runners[1:]  # the loop is the baseline
    assert re.search(r"\| \d+\.\d{3}x vs loop \(whole run\) \|", rows[0]) and "to the first step" in rows[0]
    assert "trainwell: fixed cost" in out
    assert "trainwell/trainer.py" in out.split("trainwell: fixed cost", 1)[1]  # the Trainer's own set-up is listed


def test_a_wide_figure_never_runs_into_its_neighbour():
    """On a busy machine a runner can take seconds to its first step and a thousand times the loop: every figure
    in its row still reads on its own (CI once printed '4025.781022.332x')."""
    spec = importlib.util.spec_from_file_location("short_run_benchmark", SCRIPT)
    path = list(sys.path)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    keys = [f"{part}_{clock}_ms" for part in ("total", "to_first", "setup", "finish") for clock in ("cpu", "wall")]
    loop = {key: 1.0 for key in keys}
    slow = {key: 123456.789 for key in keys}
    cli = type("Cli", (), {"model": "tiny", "steps": 8, "repeats": 1})()
    lines = module.report({"loop": [loop], "transformers 5.24.0": [slow]}, cli)
    for row in (line for line in lines if line.startswith("transformers")):
        assert row[22:].split() == ["123456.79", "123456.789x", "123456.79", "123456.79x", "123456.79", "123456.79"]
