"""Memory leaks: resident memory (RSS) over a long run, and over many Trainers built and trained in one process.

Part 1: one Trainer trains a tiny MLP (32 -> 64 -> 8) for ``--steps`` (3,000) steps of batch 16 over a 640-sample
dataset (75 epochs: the loader restarts each epoch), logging every 10 steps, evaluating 64 samples and saving a
checkpoint every 500 steps (``save_total_limit=1``). RSS is read every 100 steps (``/proc`` via psutil).
Part 2: ``--trainers`` (30) Trainers in a row, each with a fresh model, its own output folder, 20 training steps and
one evaluation, dropped (``del`` + ``gc.collect()``) before the next; RSS is read after each.

For each part: RSS at the start (after the first 500 steps / the first 5 Trainers, once allocator pools and
lazy imports have settled), at the end, and the slope of a least-squares line through the samples after that
point (KiB per 1,000 steps / per Trainer). A flat line is no leak; a leak shows as a steady positive slope (noise on
a shared machine is a few hundred KiB either way). Each library runs in its own fresh interpreter.

    .venv/bin/python benchmarks/reliability_leak.py [--steps 3000] [--trainers 30]
                                                    [--library trainwell|transformers|both]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_common import (  # noqa: E402
    Blobs,
    add_library_flag,
    answer,
    load,
    print_table,
    run_controller,
    selected,
    training_args,
)

SETTLE_STEPS, SETTLE_TRAINERS = 500, 5


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


def long_run(lib, steps: int, work: str) -> list[tuple[int, int]]:
    samples: list[tuple[int, int]] = []

    class Sample(lib.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % 100 == 0:
                gc.collect()
                samples.append((state.global_step, rss()))

    torch.manual_seed(0)
    args = training_args(lib, os.path.join(work, "long"), max_steps=steps, eval_strategy="steps", eval_steps=500,
                         save_strategy="steps", save_steps=500, save_total_limit=1, per_device_eval_batch_size=16)
    trainer = lib.Trainer(model=TinyMLP(), args=args, train_dataset=Blobs(640), eval_dataset=Blobs(64, seed=1),
                          callbacks=[Sample()])
    trainer.train()
    return samples


def many_trainers(lib, count: int, work: str) -> list[tuple[int, int]]:
    samples = []
    for i in range(count):
        torch.manual_seed(i)
        args = training_args(lib, os.path.join(work, f"trainer-{i}"), max_steps=20, per_device_eval_batch_size=16)
        trainer = lib.Trainer(model=TinyMLP(), args=args, train_dataset=Blobs(320, seed=i),
                              eval_dataset=Blobs(64, seed=100 + i))
        trainer.train()
        trainer.evaluate()
        del trainer, args
        gc.collect()
        samples.append((i + 1, rss()))
    return samples


def controller(library: str, steps: int, trainers: int) -> dict:
    torch.set_num_threads(1)
    lib = load(library)
    with tempfile.TemporaryDirectory(prefix=f"reliability-leak-{library}-") as work:
        start = time.perf_counter()
        long = long_run(lib, steps, work)
        long_s = time.perf_counter() - start
        start = time.perf_counter()
        many = many_trainers(lib, trainers, work)
        many_s = time.perf_counter() - start
    return {"long": long, "many": many, "long_s": long_s, "many_s": many_s, "version": lib.version}


def summary(samples: list[tuple[int, int]], settle: int, per: float) -> dict:
    kept = [(x, y) for x, y in samples if x >= settle] or samples
    return {"first": samples[0][1], "start": kept[0][1], "end": kept[-1][1], "peak": max(y for _, y in samples),
            "slope_kib": slope(kept) * per / 1024, "n": len(kept)}


def report(results: dict[str, dict], cli) -> None:
    libs = list(results)
    mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    long = {lib: summary(r["long"], SETTLE_STEPS, 1000) for lib, r in results.items()}
    many = {lib: summary(r["many"], SETTLE_TRAINERS, 1) for lib, r in results.items()}
    print(f"\n== RSS over {cli.steps:,} steps of one Trainer, and over {cli.trainers} Trainers in one process "
          f"(CPU, torch {torch.__version__}) ==")
    rows = [
        (f"{cli.steps:,} steps: RSS at step 100 / {SETTLE_STEPS} / {cli.steps} (MiB)",
         *[f"{mib(s['first'])} / {mib(s['start'])} / {mib(s['end'])}" for s in long.values()]),
        (f"  slope after step {SETTLE_STEPS} (KiB per 1,000 steps)",
         *[f"{s['slope_kib']:+.0f}" for s in long.values()]),
        ("  time (s)", *[f"{r['long_s']:.1f}" for r in results.values()]),
        (f"{cli.trainers} Trainers: RSS after the 1st / {SETTLE_TRAINERS}th / last (MiB)",
         *[f"{mib(s['first'])} / {mib(s['start'])} / {mib(s['end'])}" for s in many.values()]),
        (f"  slope after the {SETTLE_TRAINERS}th (KiB per Trainer)",
         *[f"{s['slope_kib']:+.0f}" for s in many.values()]),
        ("  time (s)", *[f"{r['many_s']:.1f}" for r in results.values()]),
    ]
    print_table(rows, libs, {lib: results[lib]["version"] for lib in libs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_library_flag(parser)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--trainers", type=int, default=30)
    parser.add_argument("--controller", action="store_true", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.controller:
        answer(controller(cli.library, cli.steps, cli.trainers))
        return
    results = {}
    for lib in selected(cli.library):
        start = time.perf_counter()
        argv = ["--controller", "--library", lib, "--steps", str(cli.steps), "--trainers", str(cli.trainers)]
        results[lib] = run_controller(os.path.abspath(__file__), argv)
        print(f"{lib}: done in {time.perf_counter() - start:.0f} s", flush=True)
    report(results, cli)


if __name__ == "__main__":
    main()
