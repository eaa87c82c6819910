"""Short runs: what a whole 64-step run costs, and the time to the first optimizer step, trainwell against a plain
PyTorch loop and the reference Trainer, on the model of ``benchmarks/overhead.py``.

A long run is dominated by the per-step overhead (``overhead.py`` measures it); a short run (a notebook cell, a
smoke test, a hyperparameter trial) also pays everything a framework does once: building its arguments, its
Trainer, the accelerator, the optimizer and the loader, and whatever ``train()`` does before its first step and
after its last. Each runner trains the same model (``--model mlp``: Linear-ReLU-Linear, the default; ``linear``:
one ``nn.Linear``) on the same data with the same optimizer, schedule and clipping (``overhead.py``'s runners), and
is timed from constructing its arguments (the loop: its optimizer) to

* the end of the first optimizer step ("to 1st step"), and
* ``train()`` returning ("whole run"),

in process CPU time (one torch thread; on a shared machine the steadier measure) and wall time. The runners take
turns (interleaved), ``--repeats`` times each; medians are printed, with each one's ratio to the loop's median
measured in the same call.

``--explain N`` finds where a framework's fixed cost goes: cProfile (process CPU time) over runs of ``--steps`` and
of twice as many steps, and per function the calls and time of the short run minus the half of the long run's
extra: what does not grow with the steps. The N largest by cumulative time are printed.

    python benchmarks/short_run.py [--model mlp|linear] [--steps 64] [--repeats 15] [--explain 30 [--runner NAME]]
    python benchmarks/short_run.py --smoke    # 8 steps, one run each: checks the script runs (the test suite does)
    python benchmarks/short_run.py --markdown FILE   # also append rows to benchmarks/gpu_session.sh's table
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # overhead.py beside this file; the trainwell of this checkout
import torch  # noqa: E402
from overhead import runners  # noqa: E402


def measure(found: dict, steps: int, repeats: int) -> dict[str, list[dict[str, float]]]:
    """Each runner's timings over ``repeats`` interleaved runs of ``steps`` steps, after one warm-up run each."""
    for run in found.values():  # imports, the allocator, lazily built state: not what this measures
        run(steps, steps // 2)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in found}
    for _ in range(repeats):
        for name, run in found.items():
            results[name].append(run(steps, steps // 2))
    return results


def report(results: dict[str, list[dict[str, float]]], cli: argparse.Namespace) -> list[str]:
    """The table: per runner and clock, the medians of the whole run and of the time to the first step, and their
    ratios to the loop's."""
    lines = [
        f"{cli.model} model of overhead.py, {cli.steps} steps, {cli.repeats} interleaved runs each (CPU, torch "
        f"{torch.__version__}, {torch.get_num_threads()} thread(s)); medians"
    ]
    for clock, title in (("cpu", "process CPU time"), ("wall", "wall time")):
        med = {n: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for n, runs in results.items()}
        base = med["loop"]
        lines += ["", f"{title}:", f"{'runner':<22}{'whole run ms':>13}{'vs loop':>9}{'to 1st step ms':>16}"
                  f"{'vs loop':>9}{'set-up ms':>11}{'finish ms':>11}"]
        for name, m in med.items():
            total, first = m[f"total_{clock}_ms"], m[f"to_first_{clock}_ms"]
            lines.append(
                # Each field starts with a space, so a slow runner's wide figure (seconds on a busy machine)
                # pushes the row right instead of running into its neighbour.
                f"{name:<22} {total:>12.2f} {total / base[f'total_{clock}_ms']:>7.3f}x {first:>15.2f}"
                f" {first / base[f'to_first_{clock}_ms']:>7.2f}x {m[f'setup_{clock}_ms']:>10.2f}"
                f" {m[f'finish_{clock}_ms']:>10.2f}"
            )
    lines += ["", "whole run: from building the arguments (the loop: its optimizer) to train() returning; set-up: to "
              "the first step's start; finish: the last step's end to train() returning."]
    return lines


def markdown_rows(results: dict[str, list[dict[str, float]]], cli: argparse.Namespace) -> str:
    """Rows for ``benchmarks/gpu_session.sh``'s table (the columns of ``gpu.MARKDOWN_HEADER``): each framework's
    whole run and time to the first step against the loop's, in CPU time."""
    med = {n: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for n, runs in results.items()}
    base, rows = med["loop"], ""
    for name, m in med.items():
        if name == "loop":
            continue
        total = m["total_cpu_ms"] / base["total_cpu_ms"]
        first = m["to_first_cpu_ms"] / base["to_first_cpu_ms"]
        rows += (f"| CPU | short run, {cli.model}, {cli.steps} steps: {name} | | {total:.3f}x vs loop (whole run) | "
                 f"| | | whole run {m['total_cpu_ms']:.1f} ms vs {base['total_cpu_ms']:.1f}; to the first step "
                 f"{m['to_first_cpu_ms']:.2f} ms vs {base['to_first_cpu_ms']:.2f} ({first:.2f}x); process CPU time, "
                 f"medians of {cli.repeats} |\n")
    return rows


def fixed_cost(run, steps: int, reps: int = 5) -> dict[tuple, tuple[float, float, float]]:
    """Per function (cProfile key): (calls, own seconds, cumulative seconds) of a ``steps`` run that do not grow
    with the steps: the short run's minus half the extra of a run twice as long (process CPU time)."""
    stats = []
    for n in (steps, 2 * steps):
        profile = cProfile.Profile(time.process_time)
        profile.enable()
        for _ in range(reps):
            run(n, n // 2)
        profile.disable()
        stats.append({k: (v[1] / reps, v[2] / reps, v[3] / reps) for k, v in pstats.Stats(profile).stats.items()})
    short, long = stats
    return {k: tuple(2 * a - b for a, b in zip(short.get(k, (0, 0, 0)), long.get(k, (0, 0, 0))))
            for k in short.keys() | long.keys()}


def explain(run, name: str, steps: int, top: int) -> list[str]:
    fixed = fixed_cost(run, steps)
    own = sum(v[1] for v in fixed.values())
    lines = [f"{name}: fixed cost (does not grow with the steps) {own * 1e3:.2f} ms CPU under cProfile; "
             f"the {top} largest by cumulative time:", f"{'cum ms':>8}{'own ms':>8}{'calls':>7}  function"]
    for key, (calls, tot, cum) in sorted(fixed.items(), key=lambda kv: -kv[1][2])[:top]:
        where = re.sub(r".*/(site-packages|lib/python3\.\d+)/", "", key[0])
        lines.append(f"{cum * 1e3:>8.3f}{tot * 1e3:>8.3f}{calls:>7.1f}  {where}:{key[1]}({key[2]})")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "linear"], default="mlp")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--explain", type=int, default=0, metavar="N", help="list the N largest fixed costs")
    parser.add_argument("--runner", default="trainwell", help="whose fixed cost --explain lists (loop, trainwell, "
                        "or the reference's name as printed)")
    parser.add_argument("--smoke", action="store_true", help="8 steps, one run each")
    parser.add_argument("--markdown", metavar="FILE", help="append rows to this markdown table (gpu_session.sh)")
    cli = parser.parse_args(argv)
    if cli.smoke:
        cli.steps, cli.repeats = 8, 1
    if cli.steps < 4 or cli.repeats < 1:
        parser.error(f"--steps {cli.steps} --repeats {cli.repeats}: pass at least 4 steps and 1 repeat")
    torch.set_num_threads(1)  # as overhead.py: a busy core would stall every intra-op barrier
    logging.disable(logging.WARNING)
    found = runners(cli.model)
    results = measure(found, cli.steps, cli.repeats)
    print("\n".join(report(results, cli)), flush=True)
    if cli.markdown:
        with open(cli.markdown, "a") as fh:
            fh.write(markdown_rows(results, cli))
    if cli.explain:
        if cli.runner not in found:
            parser.error(f"--runner {cli.runner!r}: choose from {sorted(found)}")
        print("\n" + "\n".join(explain(found[cli.runner], cli.runner, cli.steps, cli.explain)))


if __name__ == "__main__":
    main()
