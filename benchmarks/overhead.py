"""Per-step overhead: trainwell vs a plain PyTorch loop (and transformers when installed), same work.

Every runner trains the same tiny model on the same in-memory data with the same optimizer (fused AdamW), the
same linear LR schedule, gradient clipping at 1.0 and the same collate function, so the difference is the
training framework itself. With ``--model linear`` (the default: one ``nn.Linear``) the arithmetic is negligible
and a step costs its Python and op dispatch: what a GPU user feels, since the GPU runs kernels asynchronously
while the host's Python is the critical path whenever it is slower than the kernels it launches.

Each run is timed with timestamps (a callback's ``on_train_begin`` / ``on_step_end`` in the trainers, the same
checks inline in the loop), split into:

* set-up: from constructing the trainer (the loop: its optimizer, scheduler and loader) to the first step;
* first step: its batch, forward, backward and optimizer step, with whatever a framework does once;
* steady state: microseconds per step over steps ``--steady-from`` .. ``--steps`` (default 1,000 .. 5,000), as
  each run's median block of 500 steps (a burst of other work spoils a block, not the run);
* finish: from the last step to ``train()`` returning (the train metrics, ``on_train_end``).

Both the process's CPU time (one torch thread: the time it computed, not the time it waited for a core; the
steadier figure on a shared machine) and wall time are reported. Runs alternate between the runners and repeat;
medians over the runs (and the best run's steady state) are printed, with each framework's steady overhead over
the loop in microseconds per step. Last, function calls per steady step (cProfile, the difference between two
run lengths): a count no other job on the machine can move; ``--explain N`` lists the functions behind
trainwell's difference from the loop.

    python benchmarks/overhead.py [--model linear|mlp] [--steps 5000] [--repeats 7] [--steady-from 1000]
    python benchmarks/overhead.py --quick      # a few hundred steps, one repeat: checks the script runs
    python benchmarks/overhead.py --resilience # trainwell with its resilience arguments all off / all on
    python benchmarks/overhead.py --live       # trainwell with and without report_to="live" (live log, system
                                               # metrics sampled every TRAINWELL_SYSTEM_INTERVAL s, default 10)
    python benchmarks/overhead.py --ema        # trainwell without and with an EMA of the weights (decay 0.999)
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import logging
import pstats
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate

BATCH = 32
D_IN, HIDDEN, N_CLASSES = 32, 128, 10
LOGGING_STEPS = 500  # the reference's default
BLOCK = 500  # steady-state steps are timed in blocks of this many


class Data(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, D_IN, generator=g)
        self.y = torch.randint(0, N_CLASSES, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Classifier(nn.Module):
    """``linear``: one ``nn.Linear`` (Python dominates); ``mlp``: Linear-ReLU-Linear."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        if kind == "linear":
            self.net: nn.Module = nn.Linear(D_IN, N_CLASSES)
        else:
            self.net = nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, N_CLASSES))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Marks:
    """Timestamps of one run, each as (wall, process CPU) seconds: ``start`` (construction), ``begin`` (training
    starts), ``step N`` (after step N), ``end``.

    Steady-state steps are timed in blocks of ``BLOCK`` steps; a run's per-step cost is its median block, so a
    burst of other work on a shared machine spoils one block, not the run. CPU time (the process's, one torch
    thread) leaves out the time the process waited for a core: on a busy machine it is the steadier measure of
    the Python a step runs; wall time is reported beside it.
    """

    def __init__(self, steps: int, steady_from: int) -> None:
        self.steps, self.steady_from = steps, steady_from
        self.block = min(BLOCK, steps - steady_from)
        self.at = {1, *range(steady_from, steps + 1, self.block), steps}
        self.t: dict[str, tuple[float, float]] = {"start": _now()}

    def mark(self, name: str) -> None:
        self.t[name] = _now()

    def step(self, n: int) -> None:
        if n in self.at:
            self.t[f"step {n}"] = _now()

    def split(self) -> dict[str, float]:
        t, steps = self.t, self.steps
        edges = sorted(n for n in self.at if n >= self.steady_from)
        blocks = [(t[f"step {b}"], t[f"step {a}"], b - a) for a, b in zip(edges, edges[1:])]
        out = {}
        for i, clock in enumerate(("wall", "cpu")):
            per_step = [(end[i] - start[i]) / n for end, start, n in blocks]
            out[f"steady_{clock}_us"] = 1e6 * statistics.median(per_step)
            out[f"setup_{clock}_ms"] = 1e3 * (t["begin"][i] - t["start"][i])
            out[f"first_{clock}_ms"] = 1e3 * (t["step 1"][i] - t["begin"][i])
            out[f"finish_{clock}_ms"] = 1e3 * (t["end"][i] - t[f"step {steps}"][i])
            out[f"to_first_{clock}_ms"] = 1e3 * (t["step 1"][i] - t["start"][i])  # construction to step 1's end
            out[f"total_{clock}_ms"] = 1e3 * (t["end"][i] - t["start"][i])
        out["block"] = self.block
        return out


def _now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def plain_loop(kind: str, steps: int, steady_from: int) -> dict[str, float]:
    """What a careful user writes: the same optimizer, schedule, clipping and zeroing as the trainers."""
    torch.manual_seed(0)
    model, data = Classifier(kind), Data(steps * BATCH)
    marks = Marks(steps, steady_from)
    loader = DataLoader(
        data, batch_size=BATCH, shuffle=True, collate_fn=default_collate, generator=torch.Generator().manual_seed(0)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / steps))
    model.train()
    marks.mark("begin")
    for step, batch in enumerate(loader, start=1):
        loss = model(**batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        model.zero_grad(set_to_none=True)
        marks.step(step)
    marks.mark("end")
    return marks.split()


def framework_loop(
    kind: str, steps: int, steady_from: int, trainer_cls: type, args_cls: type, callback_cls: type,
    extra: dict | None = None, callbacks: tuple = (),
) -> dict[str, float]:
    """One ``train()`` of ``trainer_cls``; a callback (two events) takes the timestamps."""

    class Clock(callback_cls):
        def on_train_begin(self, args, state, control, **kwargs):
            marks.mark("begin")

        def on_step_end(self, args, state, control, **kwargs):
            marks.step(state.global_step)

    torch.manual_seed(0)
    model, data = Classifier(kind), Data(steps * BATCH)
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        marks = Marks(steps, steady_from)
        settings = {"output_dir": out, "per_device_train_batch_size": BATCH, "num_train_epochs": 1,
                    "learning_rate": 1e-3, "optim": "adamw_torch_fused", "save_strategy": "no", "report_to": "none",
                    "disable_tqdm": True, "logging_steps": LOGGING_STEPS, "use_cpu": True}
        args = args_cls(**{**settings, **(extra or {})})
        trainer = trainer_cls(
            model=model, args=args, train_dataset=data, data_collator=default_collate, callbacks=[Clock(), *callbacks]
        )
        trainer.train()
        marks.mark("end")
    return marks.split()


# --resilience: trainwell with its three resilience arguments off, as by default (skip_nonfinite_steps only) and all
# on (docs/resilience.md; checkpoints are asked for, as rollback_on_spike needs them: only the last step's is saved,
# in the finish time)
RESILIENCE_OFF = {"skip_nonfinite_steps": False}
RESILIENCE_ON = {"skip_nonfinite_steps": True, "rollback_on_spike": 5.0, "step_timeout": 600.0,
                 "save_strategy": "steps", "save_steps": 10**9}


def runners(kind: str, resilience: bool = False, live: bool = False,
            ema: bool = False) -> dict[str, Callable[[int, int], dict[str, float]]]:
    import trainwell

    def trainwell_with(extra: dict | None, *callbacks: Callable[[], object]) -> Callable[[int, int], dict[str, float]]:
        return lambda n, s: framework_loop(kind, n, s, trainwell.Trainer, trainwell.TrainingArguments,
                                           trainwell.TrainerCallback, extra, tuple(make() for make in callbacks))

    found: dict[str, Callable[[int, int], dict[str, float]]] = {"loop": lambda n, s: plain_loop(kind, n, s)}
    if ema:  # the per-step cost of an EMA of the weights (one _foreach_lerp_ after every optimizer step)
        from trainwell.techniques import EMA

        found["trainwell"] = trainwell_with(None)
        found["trainwell + EMA"] = trainwell_with(None, lambda: EMA(decay=0.999))
        return found
    if resilience:
        found["trainwell (all off)"] = trainwell_with(RESILIENCE_OFF)
        found["trainwell (default)"] = trainwell_with(None)  # skip_nonfinite_steps only, the default
        found["trainwell (all on)"] = trainwell_with(RESILIENCE_ON)
        return found
    found["trainwell"] = trainwell_with(None)
    if live:  # the live log and its system-metrics thread against none: only the runners that differ by it
        found["trainwell (report_to live)"] = trainwell_with({"report_to": "live"})
        return found
    try:
        import transformers
    except ImportError:
        print("transformers is not installed: comparing with the plain loop only", file=sys.stderr)
        return found
    transformers.logging.set_verbosity_error()
    found[f"transformers {transformers.__version__}"] = lambda n, s: framework_loop(
        kind, n, s, transformers.Trainer, transformers.TrainingArguments, transformers.TrainerCallback
    )
    return found


def report(results: dict[str, list[dict[str, float]]], cli: argparse.Namespace) -> None:
    model = "one nn.Linear" if cli.model == "linear" else "a Linear-ReLU-Linear MLP"
    print(
        f"{model} ({D_IN} -> {N_CLASSES}), batch {BATCH}, {cli.steps} steps, {cli.repeats} interleaved runs "
        f"each (CPU, torch {torch.__version__}, {torch.get_num_threads()} thread(s)); medians over the runs"
    )
    for clock, title in (("cpu", "process CPU time"), ("wall", "wall time")):
        base = statistics.median(r[f"steady_{clock}_us"] for r in results["loop"])
        print(f"\n{title}:")
        print(
            f"{'runner':<22}{'set-up ms':>10}{'1st step ms':>12}{'µs/step':>9}{'best':>8}{'vs loop':>9}"
            f"{'overhead µs':>12}{'finish ms':>10}"
        )
        for name, runs in results.items():
            med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            steady, best = med[f"steady_{clock}_us"], min(r[f"steady_{clock}_us"] for r in runs)
            print(
                f"{name:<22} {med[f'setup_{clock}_ms']:>9.1f} {med[f'first_{clock}_ms']:>11.2f} {steady:>8.1f}"
                f" {best:>7.1f} {steady / base:>7.3f}x {steady - base:>+11.1f} {med[f'finish_{clock}_ms']:>9.1f}"
            )
    block = results["loop"][0]["block"]
    print(
        f"\nµs/step: steps {cli.steady_from}..{cli.steps}, each run's median block of {block} steps; best: the "
        "fastest run's; overhead: over the loop's median. Set-up: construction to the first step."
    )


def calls_per_step(run: Callable[[int, int], dict[str, float]], short: int, long: int) -> Counter:
    """Function calls (Python and C, by function) per steady-state step, from cProfile: the calls of a ``long``
    run minus those of a ``short`` one, over the steps between. Deterministic: the machine's load cannot move it."""
    counts = []
    for n in (short, long):
        profile = cProfile.Profile()
        profile.enable()
        run(n, n // 2)
        profile.disable()
        counts.append(Counter({_where(key): row[1] for key, row in pstats.Stats(profile).stats.items()}))
    return Counter({k: (counts[1][k] - counts[0][k]) / (long - short) for k in counts[0] | counts[1]})


def _where(key: tuple) -> str:
    filename, line, function = key
    filename = re.sub(r".*/(site-packages|lib/python3\.\d+)/", "", filename)  # torch/..., typing.py, ...
    return f"{filename}:{line}({function})"


def report_calls(found: dict, cli: argparse.Namespace) -> None:
    short, long = (100, 300) if cli.quick else (1000, 3000)
    calls = {name: calls_per_step(run, short, long) for name, run in found.items()}
    base = sum(calls["loop"].values())
    print(f"\nfunction calls per step (cProfile, steps {short}..{long}; independent of the machine's load):")
    for name, counts in calls.items():
        total = sum(counts.values())
        print(f"{name:<22} {total:>8.1f} {total / base:>7.3f}x {total - base:>+8.1f}")
    if cli.explain and "trainwell" in calls:
        diff = Counter({k: calls["trainwell"][k] - calls["loop"][k] for k in calls["trainwell"] | calls["loop"]})
        print("\ntrainwell's calls per step minus the loop's, by function (largest first, then the loop's extra):")
        ranked = [item for item in diff.most_common() if abs(item[1]) >= 0.5]
        for where, extra in ranked[: cli.explain] + ranked[-cli.explain :][::-1]:
            print(f"{extra:>+8.2f}  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["linear", "mlp"], default="linear")
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--steady-from", type=int, default=1000, help="the first step of the steady-state window")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="300 steps (steady from 100), one run each")
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads (default 1: see below)")
    parser.add_argument("--resilience", action="store_true",
                        help="compare trainwell with skip_nonfinite_steps, rollback_on_spike and step_timeout all "
                             "off, as by default and all on (no transformers runner)")
    parser.add_argument("--live", action="store_true",
                        help="compare trainwell with and without report_to='live' (its live log and system metrics)")
    parser.add_argument("--ema", action="store_true",
                        help="compare trainwell without and with EMA(decay=0.999) (no transformers runner)")
    parser.add_argument(
        "--explain",
        type=int,
        default=0,
        metavar="N",
        help="list the N functions whose calls per step differ most between trainwell and the loop",
    )
    cli = parser.parse_args()
    if cli.quick:
        cli.steps, cli.steady_from, cli.repeats = 300, 100, 1
    if not 1 < cli.steady_from < cli.steps:
        parser.error(f"--steady-from {cli.steady_from}: pass a step between 1 and --steps ({cli.steps}), exclusive")
    # One thread: a one-layer model's kernels gain nothing from more, and on a shared machine a busy core stalls
    # every intra-op barrier (a step then measures the neighbours, not the framework).
    torch.set_num_threads(cli.threads)
    logging.disable(logging.WARNING)  # the trainers' INFO/WARNING lines would be timed too
    found = runners(cli.model, cli.resilience, cli.live, cli.ema)
    for run in found.values():  # warm-up: imports, allocator, thread pools
        run(200 if not cli.quick else 20, 10)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in found}
    for _ in range(cli.repeats):
        for name, run in found.items():  # interleaved: a slow spell of the machine hits every runner alike
            results[name].append(run(cli.steps, cli.steady_from))
    report(results, cli)
    report_calls(found, cli)


if __name__ == "__main__":
    main()
