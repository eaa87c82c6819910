"""benchmarks/gpu_profile.py and benchmarks/gpu_session.sh keep working without a GPU: the profile's smoke runs
the loop and trainwell under torch.profiler (CPU operators in the kernels' place) and compares them; the session
script writes its one table, keeps going and stops at its time budget."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
ENV = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}


def _load(name: str):
    path = list(sys.path)
    sys.path.insert(0, BENCHMARKS)
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_benchmark", os.path.join(BENCHMARKS, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    return module


profile = _load("gpu_profile")
CPU_ONLY = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the smoke is the CPU check")


@CPU_ONLY
def test_smoke_profiles_the_loop_and_trainwell_per_step(tmp_path):
    table = tmp_path / "table.md"
    proc = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "gpu_profile.py"), "bf16", "--smoke", "--top",
                           "5", "--markdown", str(table)], capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.split("trainwell bf16 against loop bf16", 1)[1]
    for line in ("wall ms", "process CPU ms", "GPU busy", "CPU ops launched", "device-to-host copies",
                 "synchronizations", "only in trainwell bf16:", "only in loop bf16:", "aten::"):
        assert line in out, line
    launched = next(line for line in out.splitlines() if line.startswith("CPU ops launched")).split()[-2:]
    assert all(float(n) > 10 for n in launched)  # both sides' operators were recorded over the profiled steps
    row = table.read_text()
    assert row.startswith("| tiny | profile: trainwell bf16 vs loop bf16 |") and "CPU ops/step" in row


def _event(name, device_type, start=0.0, end=0.0, self_cpu=0.0, children=()):
    return types.SimpleNamespace(name=name, device_type=device_type, time_range=types.SimpleNamespace(
        start=start, end=end), self_cpu_time_total=self_cpu, cpu_children=list(children))


def test_summaries_count_kernels_copies_and_syncs_per_step_and_compare_both_sides():
    from torch.autograd import DeviceType

    events = [_event("gemm", DeviceType.CUDA, 0, 400), _event("gemm", DeviceType.CUDA, 300, 600),
              _event("Memcpy DtoH (Device -> Pinned)", DeviceType.CUDA, 700, 710),
              _event("cudaStreamSynchronize", DeviceType.CPU), _event("aten::_local_scalar_dense", DeviceType.CPU)]
    ours = profile.summarize(events, "cuda", steps=2, wall=0.001, cpu=0.0005)
    assert ours["ops"]["gemm"] == [1.0, 350.0] and ours["d2h"] == [0.5, 5.0] and ours["syncs"] == 1.0
    assert ours["busy"] == pytest.approx(0.61)  # 0..600 and 700..710 of 1,000 us: overlaps counted once
    loop = profile.summarize(events[:2], "cuda", steps=2, wall=0.001, cpu=0.0005)
    text = "\n".join(profile.compare(("loop x", "trainwell x"), (loop, ours), top=5))
    assert "only in trainwell x: 1\n  Memcpy DtoH" in text and "only in loop x: 0" in text
    cpu = profile.summarize([_event("aten::linear", DeviceType.CPU, self_cpu=5, children=[_event("aten::addmm", 0)]),
                             _event("aten::addmm", DeviceType.CPU, self_cpu=30)], "cpu", steps=1, wall=1, cpu=1)
    assert cpu["ops"] == {"aten::addmm": [1.0, 30.0]} and cpu["busy"] is None  # leaf operators only


@CPU_ONLY
def test_the_session_script_writes_one_table_and_stops_at_its_budget(tmp_path):
    """Within a 20 s budget the first steps run (the profile, the first rows); the rest are listed as not run."""
    out = tmp_path / "session.md"
    env = {**ENV, "PYTHON": sys.executable, "GPU_SESSION_SECONDS": "20"}
    proc = subprocess.run(["bash", os.path.join(BENCHMARKS, "gpu_session.sh"), str(out), "--smoke"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = out.read_text().splitlines()
    assert "torch" in lines[0] and "accelerate" in lines[0] and "smoke" in lines[0]  # versions, date, the card
    table = [line for line in lines[2:]]
    assert table[0].startswith("| size | configuration |") and all(line.startswith("|") for line in table)
    assert len(lines) == 2 + len(table)  # one table, nothing else
    assert table[2].startswith("| tiny | profile: trainwell bf16 vs loop bf16 |")
    notes = [line.rsplit("|", 2)[-2].strip() for line in table[2:]]
    assert "not run: the session's time budget was spent" in notes
    assert "| llama-1b | loop QLoRA bf16 |" in "\n".join(table)  # rows past the budget are named (the 1b ones too)
    assert table[-1].startswith("| | short_run.py (CPU) |")
    assert os.path.exists(f"{out}.log")
