"""Checkpoint blocking time: how long the training loop stands still for each save, with ``save_async=True``
against trainwell's synchronous save and against the reference (transformers, when installed).

The model is the ~100M-parameter ``nn.Sequential`` of ``benchmarks/resume.py`` (24 ``Linear(2048, 2048)``) with
AdamW (1.15 GiB per checkpoint: weights, two moments, scheduler, RNG, trainer state). A real ``train()`` runs
``--steps`` steps and saves every ``--every`` steps; a ``Trainer`` subclass times each ``_save_checkpoint`` call
(the whole save as the loop sees it, including waiting for the previous background write). Each configuration
runs in a fresh subprocess, the configurations alternate over ``--rounds`` rounds (disk speed drifts on a shared
machine), and the page cache is flushed (``os.sync``) before each run.

Reported per configuration: the first save (trainwell allocates its host buffers there), the median of the later
saves, the wall time of ``train()`` and of the same run without saves. The goal of the issue: a background save
blocks the loop for at most 10% of the synchronous save's time. ``sync, no manifest`` saves without checksums and
without ``checkpoint_manifest.json``: its ratio to ``trainwell sync`` is the manifest's cost. Nothing is asserted.

    python benchmarks/async_save.py [--quick] [--steps 16] [--every 4] [--rounds 2] [--no-reference]

``--quick``: a ~10M-parameter model (seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch.utils.data._utils.collate import default_collate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resume import Big, Vectors, _impl  # noqa: E402  (the resume benchmark's model, data and imports)

BATCH = 8
CONFIGS = {  # name -> (implementation, save_async, saves)
    "no saves": ("trainwell", False, False),
    "trainwell sync": ("trainwell", False, True),
    "sync, no manifest": ("trainwell", False, True),  # the checkpoint manifest's cost: no checksums, no manifest
    "trainwell async": ("trainwell", True, True),
    "transformers": ("transformers", False, True),
}


def _without_manifest() -> None:
    """BENCHMARK ONLY: saves without checksums and without ``checkpoint_manifest.json``."""
    from pathlib import Path

    from trainwell.checkpoint import checkpointer
    from trainwell.utils import filehash

    filehash.recording = lambda folder: filehash.Recording(Path(folder))  # never registered: nothing is hashed
    checkpointer._write_manifest = lambda folder, recorded: None


def _classes(impl: str):
    Trainer, TrainingArguments, _ = _impl(impl)  # quiet logging, as in the resume benchmark

    class TimedSaves(Trainer):
        """Records the time of every ``_save_checkpoint`` call: the loop's blocking time per save."""

        save_times: list[float] = []

        def _save_checkpoint(self, model, trial):
            start = time.perf_counter()
            super()._save_checkpoint(model, trial)
            self.save_times.append(time.perf_counter() - start)

    return TimedSaves, TrainingArguments


def child(config: str, width: int, depth: int, steps: int, every: int) -> dict:
    impl, background, saves = CONFIGS[config]
    Trainer, Args = _classes(impl)
    if config == "sync, no manifest":
        _without_manifest()
    extra = {"save_async": True} if background else {}
    with tempfile.TemporaryDirectory() as work:
        args = Args(output_dir=os.path.join(work, "run"), per_device_train_batch_size=BATCH, learning_rate=1e-5,
                    optim="adamw_torch", max_steps=steps, save_strategy="steps" if saves else "no",
                    save_steps=every, logging_steps=10_000, report_to="none", disable_tqdm=True, use_cpu=True,
                    seed=42, dataloader_num_workers=0, **extra)
        torch.manual_seed(0)
        trainer = Trainer(model=Big(width, depth), args=args, train_dataset=Vectors(steps * BATCH, width),
                          data_collator=default_collate)
        params = sum(p.numel() for p in trainer.model.parameters())
        os.sync()
        start = time.perf_counter()
        trainer.train()  # with save_async, returns once the last checkpoint is published
        wall = time.perf_counter() - start
        written = sorted((d for d in os.listdir(args.output_dir) if d.startswith("checkpoint-")),
                         key=lambda d: int(d.split("-")[1]))
    return {"config": config, "params": params, "saves": trainer.save_times, "wall": wall, "written": written}


def _run_child(cli_args: list[str]) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), *cli_args]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cli_args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(results: dict[str, list[dict]], steps: int, every: int) -> None:
    params = next(iter(results.values()))[0]["params"]
    rounds = len(next(iter(results.values())))
    print(f"\n== {params / 1e6:.1f}M parameters + AdamW, {steps} steps, a save every {every} steps, "
          f"{rounds} round(s) ==")
    print(f"{'configuration':<18}{'first save':>12}{'later saves':>13}{'p25-p75':>16}{'train()':>10}"
          f"{'over no saves':>15}  written")
    base = min(r["wall"] for r in results["no saves"])
    later: dict[str, float] = {}
    spread: dict[str, tuple[float, float]] = {}  # the middle half of the later saves
    for config, runs in results.items():
        wall = min(r["wall"] for r in runs)
        if config == "no saves":
            print(f"{config:<18}{'':>12}{'':>13}{'':>16}{wall:>9.2f}s{'':>15}")
            continue
        first = min(r["saves"][0] for r in runs)
        times = [t for r in runs for t in r["saves"][1:]]
        later[config] = statistics.median(times)
        quartiles = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
        spread[config] = (quartiles[0], quartiles[2])
        names = ", ".join(runs[0]["written"])
        print(f"{config:<18}{first:>11.3f}s{later[config]:>12.3f}s{quartiles[0]:>8.3f}-{quartiles[2]:.3f}s"
              f"{wall:>9.2f}s{wall - base:>+14.2f}s  {names}")
    if "trainwell async" in later and "trainwell sync" in later:
        share = later["trainwell async"] / later["trainwell sync"]
        print(f"async blocking / sync save: {share:.1%} (goal <= 10%) -> {'met' if share <= 0.10 else 'MISSED'}")
    if "sync, no manifest" in later and "trainwell sync" in later:
        ratio = later["trainwell sync"] / later["sync, no manifest"]
        low, high = spread["sync, no manifest"]
        inside = low <= later["trainwell sync"] <= high
        print(f"sync save with the manifest / without it: {ratio:.3f}x (the checksums and checkpoint_manifest.json); "
              f"the median with it is {'inside' if inside else 'OUTSIDE'} the middle half of the saves without it")
    if "transformers" in later and "trainwell async" in later:
        print(f"async blocking / transformers' save: {later['trainwell async'] / later['transformers']:.1%}")
    print("first save: trainwell's async save allocates its host buffers there (later saves reuse them).\n"
          "later saves: the median over all rounds of the loop's time in _save_checkpoint; for async this is the\n"
          "  host copy of weights and optimizer state plus the small files (RNG, trainer state, arguments), and any\n"
          "  wait for the previous background write. The sync saves fsync every file (trainwell) or not (reference).\n"
          "train(): wall time of the whole run, the last background write included (train() waits for it).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~10M-parameter model")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--child", choices=list(CONFIGS))
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--depth", type=int, default=None)
    cli = parser.parse_args()
    width = cli.width or (1024 if cli.quick else 2048)
    depth = cli.depth or (10 if cli.quick else 24)
    if cli.child:
        with contextlib.redirect_stdout(sys.stderr):  # library prints must not mix with the JSON answer
            result = child(cli.child, width, depth, cli.steps, cli.every)
        print(json.dumps(result))
        return
    configs = list(CONFIGS)
    try:
        import transformers

        version = f", transformers {transformers.__version__}"
    except ImportError:
        version = ""
    if cli.no_reference or not version:
        configs.remove("transformers")
        version = ""
    print(f"CPU, torch {torch.__version__}{version}")
    sizes = ["--width", str(width), "--depth", str(depth), "--steps", str(cli.steps), "--every", str(cli.every)]
    results: dict[str, list[dict]] = {c: [] for c in configs}
    for _ in range(cli.rounds):
        for config in configs:
            results[config].append(_run_child(["--child", config, *sizes]))
    report(results, cli.steps, cli.every)


if __name__ == "__main__":
    main()
