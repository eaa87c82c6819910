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


ENGINE_ROWS = [n for n, c in gpu.CONFIGS.items() if "zero" in c.options]  # DeepSpeed: their own test, below


def _smoke(names: list[str]) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--only", ",".join(names)], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = _rows(proc.stdout)
    assert set(rows) == set(names), proc.stdout  # every configuration has its row
    return rows


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the smoke is the CPU check")
def test_smoke_runs_every_configuration_a_cpu_can_run():
    rows = _smoke([n for n in gpu.CONFIGS if n not in ENGINE_ROWS])
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
        "transformers FSDP2 bf16",
        "trainwell FSDP2 AC bf16",
        "transformers FSDP2 AC bf16",
        "transformers ZeRO-3 bf16",
    }  # test_gpu_only_rows_get_the_arguments_of_their_configuration checks what these would run with
    for loop in ("loop FSDP2 bf16", "loop FSDP2 AC bf16"):
        assert not rows[loop].startswith("skipped")  # the hand-written FSDP2 loops run on gloo


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the smoke is the CPU check")
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
def test_smoke_runs_the_zero3_rows_on_gloo():
    """DeepSpeed runs on a CPU (torchrun, gloo; its shared-memory build skipped): the hand-written ZeRO-3 loop
    (deepspeed.initialize, engine.backward, engine.step) and trainwell's ZeRO-3 row, compared. The ZeRO-2 rows run
    the same code with stage 2."""
    rows = _smoke(["loop ZeRO-3 bf16", "trainwell ZeRO-3 bf16"])
    for name, row in rows.items():
        assert not row.startswith(("failed", "timed out", "skipped")), f"{name}: {row}"
    assert re.fullmatch(r"\d+\.\d{3}x", rows["trainwell ZeRO-3 bf16"].split()[1])
    assert {gpu.CONFIGS[n].options["zero"] for n in ENGINE_ROWS} == {2, 3}


@pytest.mark.parametrize("size", ["gpt2-small", "1b"])
def test_gpu_only_rows_get_the_arguments_of_their_configuration(size, tmp_path):
    """The rows a CPU cannot run (Accelerate runs FSDP only on GPUs; the reference refuses bf16 on a CPU unless
    use_cpu=True, which turns DeepSpeed off): what each would be built with, checked here."""
    import gpu_runners

    import trainwell

    cli, _ = gpu.parse(["--size", size])
    block = "LlamaBlock" if size == "1b" else "Block"
    reference_fields = None
    if importlib.util.find_spec("transformers") is not None:
        import transformers

        reference_fields = set(transformers.TrainingArguments.__dataclass_fields__)
    for name, config in gpu.CONFIGS.items():
        if config.runner == "loop":
            continue
        kwargs = gpu_runners.trainer_arguments(config.runner, config.options, cli, str(tmp_path), config.launched)
        if reference_fields is not None:
            assert set(kwargs) <= reference_fields, name  # the reference takes every argument the row passes
        if config.runner != "trainwell" or config.options["precision"] == "fp16":
            continue
        args = trainwell.TrainingArguments(**kwargs)
        assert args.optim == "adamw_torch_fused" and args.max_steps == cli.warmup + cli.steps, name
        if config.options.get("fsdp"):
            plugin = args.fsdp_plugin_args
            assert plugin["transformer_cls_names_to_wrap"] in (block, [block]), name
            assert bool(plugin.get("activation_checkpointing")) == bool(config.options.get("checkpointing")), name
        if config.options.get("zero"):
            assert args.deepspeed["zero_optimization"]["stage"] == config.options["zero"], name
            assert args.deepspeed["train_micro_batch_size_per_gpu"] == "auto", name
    assert cli.size == ("llama-1b" if size == "1b" else "gpt2-small")


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


def test_markdown_rows_and_a_spent_budget(monkeypatch, tmp_path, capsys):
    """--markdown appends a row per configuration (a failure says why); past --deadline a row is not run."""
    calls = []

    def child(name, cli):
        calls.append(name)
        return dict(FAKE)

    monkeypatch.setattr(gpu, "child", child)
    table = tmp_path / "table.md"
    gpu.main(["--smoke", "--only", "loop bf16,trainwell bf16,loop fp16", "--markdown", str(table)])
    lines = table.read_text().splitlines()
    assert [line.split(" | ")[1] for line in lines] == ["loop bf16", "trainwell bf16", "loop fp16"]
    assert "1.000x vs loop bf16 (>= 0.99: met)" in lines[1] and "skipped: needs a CUDA GPU" in lines[2]
    assert all(line.count("|") == gpu.MARKDOWN_HEADER.splitlines()[0].count("|") for line in lines)
    gpu.main(["--smoke", "--only", "loop bf16", "--markdown", str(table), "--deadline", "0"])
    assert "not run: the session's time budget was spent" in table.read_text().splitlines()[-1]
    assert calls == ["loop bf16", "trainwell bf16"]


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
