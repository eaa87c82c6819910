"""benchmarks/gpu.py keeps working without a GPU: its CPU smoke runs every configuration a CPU can run, and a
configuration that fails or times out still gets its row (the others are measured)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu.py")


def _load():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path  # the script puts benchmarks/ first: keep its file names from shadowing other modules
    return module


gpu = _load()
FAKE = {"seconds": 2.0, "losses": [6.3, 6.1], "params": 1000, "peak_bytes": 0, "tokens": 512, "flops_per_param": 6}


def _rows(text: str) -> dict[str, str]:
    """Each configuration's row of the printed table, by name."""
    rows = {}
    for line in text.splitlines():
        name = max((n for n in gpu.CONFIGS if line.startswith(n + " ")), key=len, default=None)
        if name is not None and name not in rows:  # the first: the summary lines come later
            rows[name] = line[len(name) :].strip()
    return rows


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the smoke is the CPU check")
def test_smoke_runs_every_configuration_a_cpu_can_run():
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(proc.stdout)
    assert set(rows) == set(gpu.CONFIGS), proc.stdout  # every configuration has its row
    for name, row in rows.items():
        reason = gpu.skip_reason(gpu.CONFIGS[name], "cpu")
        if reason is not None:
            assert row == reason  # fp16, trainwell's FSDP2, ZeRO-3: a GPU; or a package not installed
            continue
        assert not row.startswith(("failed", "timed out")), f"{name}: {row}"
        rate, *rest = row.split()
        assert float(rate.replace(",", "")) > 0, row
        if gpu.CONFIGS[name].baseline:
            assert re.fullmatch(r"\d+\.\d{3}x", rest[0]), row  # the ratio to its hand-written baseline
    assert {n for n, c in gpu.CONFIGS.items() if gpu.GPU_ONLY in c.needs} == {
        "loop fp16",
        "trainwell fp16",
        "trainwell FSDP2 bf16",
        "trainwell ZeRO-3 bf16",
    }
    assert not rows["loop FSDP2 bf16"].startswith("skipped")  # the hand-written FSDP2 loop runs on gloo


def test_a_failing_configuration_still_gets_its_row_and_the_others_run(monkeypatch, capsys):
    def child(name, cli):
        if name == "trainwell bf16":
            raise RuntimeError("CUDA out of memory\nTried to allocate 2.00 GiB")
        return dict(FAKE)

    monkeypatch.setattr(gpu, "child", child)
    gpu.main(["--smoke", "--only", "loop bf16,trainwell bf16", "--only", "loop bf16 clip,trainwell bf16 clip"])
    rows = _rows(capsys.readouterr().out)
    assert rows["trainwell bf16"] == "failed: RuntimeError: CUDA out of memory"
    assert rows["loop bf16"].split()[0] == "256"  # 512 tokens in 2 s
    assert rows["trainwell bf16 clip"].split()[:2] == ["256", "1.000x"]


def test_a_configuration_that_times_out_still_gets_its_row(monkeypatch, capsys):
    def run(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(gpu.subprocess, "run", run)
    gpu.main(["--device", "cpu", "--tiny", "--timeout", "7", "--only", "loop bf16,loop FSDP2 bf16"])
    rows = _rows(capsys.readouterr().out)
    assert rows == {"loop bf16": "timed out after 7 s", "loop FSDP2 bf16": "timed out after 7 s"}


def test_a_failed_child_process_is_named_by_its_error_line():
    output = "Traceback (most recent call last):\n  File ...\ntorch.OutOfMemoryError: CUDA out of memory.\n[rank0]: x\n"
    assert gpu._error_line(output) == "torch.OutOfMemoryError: CUDA out of memory."
    assert gpu._error_line("") == "no output"
    torchrun = (
        "[rank0]: Traceback (most recent call last):\n[rank0]: ValueError: FSDP2 mapping failed\n"
        "Traceback (most recent call last):\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n====\n/x/gpu.py FAILED\n"
    )
    assert gpu._error_line(torchrun) == "ValueError: FSDP2 mapping failed"


def test_only_names_its_choices_and_dry_run_lists_every_configuration(capsys):
    with pytest.raises(SystemExit):
        gpu.parse(["--only", "loop bf16,trainwell bf17"])
    err = capsys.readouterr().err
    assert "['trainwell bf17']" in err and "trainwell FSDP2 bf16" in err
    gpu.main(["--device", "cpu", "--dry-run"])
    rows = _rows(capsys.readouterr().out)
    assert set(rows) == set(gpu.CONFIGS)
    assert rows["loop fp16"] == "skipped: needs a CUDA GPU"
    assert rows["loop FSDP2 bf16"] == "would run in torchrun --nproc_per_node 1"
