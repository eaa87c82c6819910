"""Where a configuration's points go: one configuration of ``benchmarks/gpu.py`` run by its hand-written loop and by
trainwell under ``torch.profiler``, compared per optimizer step.

Each side runs in its own process exactly as ``gpu.py`` runs it (its runners, its launcher), with the profiler on
over the timed steps only (after the warm-up, between two synchronizations). Printed per optimizer step, for the
loop and for trainwell side by side:

* wall time and the process's CPU time;
* GPU busy: the union of the kernels' (and copies') device intervals over the wall time of the profiled steps;
* the kernels by name with their count and device time, the largest first; the kernels one side launches that
  the other does not, and those both launch a different number of times;
* device-to-host copies (``Memcpy DtoH``) and synchronizations (``cuda*Synchronize`` calls, and the
  ``aten::_local_scalar_dense`` behind each ``.item()``).

On a CPU (``--smoke``, ``--device cpu``) there are no kernels: the leaf ``aten::`` operators and their CPU time take
their place (the same code paths run; GPU busy is not measured).

    python benchmarks/gpu_profile.py bf16 [--size gpt2-small|1b] [--warmup 3] [--steps 5] [--top 25]
    python benchmarks/gpu_profile.py "trainwell bf16 compiled"     # a trainwell row of gpu.py, or its suffix
    python benchmarks/gpu_profile.py bf16 --smoke                  # CPU, tiny model: checks the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import torch  # noqa: E402
from gpu_runners import Window  # noqa: E402

SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent")


class ProfileWindow(Window):
    """The profiler over the timed steps of one run; its summary (:func:`summarize`) written to ``path`` as JSON by
    the first process."""

    def __init__(self, device: str, path: str, steps: int) -> None:
        self.device, self.path, self.steps = device, path, steps
        self.profile: torch.profiler.profile | None = None

    def begin(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profile = torch.profiler.profile(activities=activities)
        self.profile.start()
        self.started = (time.perf_counter(), time.process_time())

    def end(self) -> None:  # the caller has synchronized: every kernel of the profiled steps has finished
        wall, cpu = time.perf_counter() - self.started[0], time.process_time() - self.started[1]
        self.profile.stop()
        if os.environ.get("RANK", "0") == "0":
            with open(self.path, "w") as fh:
                json.dump(summarize(self.profile.events(), self.device, self.steps, wall, cpu), fh)


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarize(events: list, device: str, steps: int, wall: float, cpu: float) -> dict:
    """Per optimizer step: the kernels (on a CPU: the leaf ``aten::`` operators) by name as [count, µs], the
    device-to-host copies, the synchronizations, GPU busy, wall and CPU milliseconds."""
    from torch.autograd import DeviceType

    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    d2h, syncs, intervals = [0.0, 0.0], 0.0, []
    for event in events:
        name = event.name
        if event.device_type == DeviceType.CUDA:
            span = (event.time_range.start, event.time_range.end)
            intervals.append(span)
            ops[name][0] += 1
            ops[name][1] += span[1] - span[0]
            if "DtoH" in name:
                d2h[0] += 1
                d2h[1] += span[1] - span[0]
        elif name in SYNC_CALLS or name == "aten::_local_scalar_dense":
            syncs += 1
        elif device != "cuda" and name.startswith("aten::"):
            if not any(child.name.startswith("aten::") for child in event.cpu_children):
                ops[name][0] += 1
                ops[name][1] += event.self_cpu_time_total
    return {
        "unit": "kernels" if device == "cuda" else "CPU ops",
        "steps": steps,
        "wall_ms": 1e3 * wall / steps,
        "cpu_ms": 1e3 * cpu / steps,
        "busy": _union_us(intervals) / (1e6 * wall) if device == "cuda" else None,
        "ops": {name: [count / steps, us / steps] for name, (count, us) in ops.items()},
        "d2h": [d2h[0] / steps, d2h[1] / steps],
        "syncs": syncs / steps,
    }


def _short(name: str, width: int = 78) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def compare(names: tuple[str, str], sides: tuple[dict, dict], top: int) -> list[str]:
    """The side-by-side report of two summaries (the loop's first)."""
    loop, ours = sides
    unit = loop["unit"]
    both = lambda f: f"{f(loop):>18}{f(ours):>18}"  # noqa: E731
    lines = [
        f"{'per optimizer step (' + str(loop['steps']) + ' profiled)':<40}{names[0]:>18.17}{names[1]:>18.17}",
        f"{'wall ms':<40}" + both(lambda s: f"{s['wall_ms']:.2f}"),
        f"{'process CPU ms':<40}" + both(lambda s: f"{s['cpu_ms']:.2f}"),
        f"{'GPU busy':<40}" + both(lambda s: "-" if s["busy"] is None else f"{s['busy']:.1%}"),
        f"{unit + ' launched':<40}" + both(lambda s: f"{sum(c for c, _ in s['ops'].values()):.1f}"),
        f"{unit + ' time ms':<40}" + both(lambda s: f"{sum(t for _, t in s['ops'].values()) / 1e3:.2f}"),
        f"{'device-to-host copies (us)':<40}" + both(lambda s: f"{s['d2h'][0]:.1f} ({s['d2h'][1]:.0f})"),
        f"{'synchronizations':<40}" + both(lambda s: f"{s['syncs']:.1f}"),
        "",
        f"{unit + ' by time: count and us per step':<60}{names[0]:>18.17}{names[1]:>18.17}",
    ]
    every = set(loop["ops"]) | set(ours["ops"])
    ranked = sorted(every, key=lambda n: -max(loop["ops"].get(n, [0, 0])[1], ours["ops"].get(n, [0, 0])[1]))
    for name in ranked[:top]:
        a, b = loop["ops"].get(name, [0, 0]), ours["ops"].get(name, [0, 0])
        lines.append(f"{_short(name, 59):<60}{a[0]:>7.1f}{a[1]:>11.1f}{b[0]:>7.1f}{b[1]:>11.1f}")
    for title, mine, other in ((f"only in {names[1]}", ours, loop), (f"only in {names[0]}", loop, ours)):
        only = sorted(set(mine["ops"]) - set(other["ops"]), key=lambda n: -mine["ops"][n][1])
        lines += ["", f"{title}: {len(only)}"]
        lines += [f"  {_short(n)}  x{mine['ops'][n][0]:.1f}  {mine['ops'][n][1]:.1f} us" for n in only]
    counts = [n for n in sorted(set(loop["ops"]) & set(ours["ops"])) if loop["ops"][n][0] != ours["ops"][n][0]]
    lines += ["", f"launched a different number of times: {len(counts)}"]
    lines += [f"  {_short(n)}  {loop['ops'][n][0]:.1f} vs {ours['ops'][n][0]:.1f}" for n in counts]
    return lines


def markdown_row(size: str, names: tuple[str, str], sides: tuple[dict, dict] | str) -> str:
    """One row of the session's table (the columns of ``gpu.MARKDOWN_HEADER``): the profile's headline figures."""
    if isinstance(sides, str):
        return f"| {size} | profile: {names[1]} vs {names[0]} | | | | | | {sides.replace('|', '/')} |\n"
    loop, ours = sides
    extra = sorted(set(ours["ops"]) - set(loop["ops"]), key=lambda n: -ours["ops"][n][1])
    missing = sorted(set(loop["ops"]) - set(ours["ops"]), key=lambda n: -loop["ops"][n][1])
    busy = "" if loop["busy"] is None else f"GPU busy {loop['busy']:.1%} vs {ours['busy']:.1%}; "
    note = (
        f"{busy}{loop['unit']}/step {sum(c for c, _ in loop['ops'].values()):.0f} vs "
        f"{sum(c for c, _ in ours['ops'].values()):.0f}; only in trainwell {len(extra)} "
        f"({', '.join(_short(n, 40) for n in extra[:3])}); only in the loop {len(missing)}; D2H/step "
        f"{loop['d2h'][0]:.1f} vs {ours['d2h'][0]:.1f}; syncs/step {loop['syncs']:.1f} vs {ours['syncs']:.1f}; "
        f"CPU ms/step {loop['cpu_ms']:.2f} vs {ours['cpu_ms']:.2f}"
    )
    return f"| {size} | profile: {names[1]} vs {names[0]} | | | | | | {note.replace('|', '/')} |\n"


def _pair(config: str, parser: argparse.ArgumentParser) -> tuple[str, str]:
    import gpu

    candidates = [config, f"trainwell {config}"]
    name = next((n for n in candidates if n in gpu.CONFIGS and gpu.CONFIGS[n].runner == "trainwell"), None)
    if name is None:
        rows = [n.removeprefix("trainwell ") for n, c in gpu.CONFIGS.items() if c.runner == "trainwell"]
        parser.error(f"{config!r}: name a trainwell row of benchmarks/gpu.py, or its suffix: {', '.join(rows)}")
    return gpu.CONFIGS[name].baseline, name


def main(argv: list[str] | None = None) -> None:
    import gpu

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a trainwell row of gpu.py (or its suffix: bf16, fp16, bf16 compiled, ...)")
    parser.add_argument("--top", type=int, default=25, help="kernels listed by time")
    parser.add_argument("--markdown", metavar="FILE", help="append the headline figures to this markdown table")
    args, rest = parser.parse_known_args(argv)
    cli, _ = gpu.parse(["--steps", "5", "--warmup", "3", "--logging-steps", "5", *rest])
    names = _pair(args.config, parser)
    sides: list[dict] | str = []
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            path = os.path.join(folder, name.replace(" ", "_") + ".json")
            cli.profile_out = path
            left = None if cli.deadline is None else cli.deadline - time.time()
            reason = gpu.skip_reason(gpu.CONFIGS[name], cli.device)
            if reason is None and left is not None and left < 5:
                reason = "not run: the session's time budget was spent"
            result = reason or gpu.launch(name, [*gpu.child_flags(cli), "--profile-out", path], cli, left)
            if isinstance(result, str) or not os.path.exists(path):
                sides = f"{name}: {result if isinstance(result, str) else 'no profile written'}"
                break
            with open(path) as fh:
                sides.append(json.load(fh))
    where = torch.cuda.get_device_name() if cli.device == "cuda" and torch.cuda.is_available() else "CPU"
    print(f"{names[1]} against {names[0]}: {cli.size}, batch {cli.batch}, {cli.warmup} warm-up + {cli.steps} "
          f"profiled steps ({where}, torch {torch.__version__})")
    print(sides if isinstance(sides, str) else "\n".join(compare(names, tuple(sides), args.top)), flush=True)
    if args.markdown:
        with open(args.markdown, "a") as fh:
            fh.write(markdown_row(cli.size, names, sides if isinstance(sides, str) else tuple(sides)))
    if isinstance(sides, str):
        sys.exit(1)


if __name__ == "__main__":
    main()
