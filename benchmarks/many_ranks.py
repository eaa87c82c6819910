"""What one process pays for a checkpoint save and for a resume, at 2, 4 and 8 processes (torchrun, gloo, CPU).

For each process count N: ``tests/distributed/ranks_script.py`` trains an MLP (``--width``/``--hidden``; AdamW)
on N x 2 x 6 samples (6 steps of a global batch of N x 2), saves every 2 steps, and process 0 is SIGKILLed as
step 5 ends; the run then resumes at N processes from ``checkpoint-4``. Each process records the clock and, from
``/proc/self/io``, ``rchar``/``wchar``: the bytes it passed to ``read()``/``write()``-family system calls (files;
a socket only where it is read or written with those calls):

* ``save``: ``Trainer._save_checkpoint`` (the second save: the first also pays one-off work), seconds and bytes;
* ``resume``: ``train(resume_from_checkpoint=...)`` to the first step, minus a fresh run's ``train()`` to its
  first step (``start``), which pays the same imports and set-up.

The table gives process 0 (which writes every file: the model, the optimizer, and every process's RNG state) and
the mean of the others.

    .venv/bin/python benchmarks/many_ranks.py [--procs 2 4 8] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "distributed" / "ranks_script.py"


def launch(procs: int, workdir: Path, record: Path, tag: str, *flags: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parents[2])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs), str(SCRIPT),
           "--workdir", str(workdir), "--record", str(record), "--tag", tag, *flags]
    subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def costs(record: Path, tag: str, procs: int) -> list[dict[str, dict]]:
    """Per process: what -> its record (the last save's for ``save``)."""
    out = []
    for rank in range(procs):
        rows = [json.loads(line) for line in (record / f"cost_{tag}_rank{rank}.jsonl").read_text().splitlines()]
        out.append({row["what"]: row for row in rows})
    return out


def measure(procs: int, width: int, hidden: int, root: Path) -> dict[str, list[float]]:
    workdir, record = root / f"run{procs}", root / "record"
    common = ("--samples", str(procs * 2 * 6), "--width", str(width), "--hidden", str(hidden))
    launch(procs, workdir, record, f"fresh{procs}", *common, "--kill-at", "5")
    launch(procs, workdir, record, f"resumed{procs}", *common, "--resume", str(workdir / "checkpoint-4"),
           "--save-steps", "100")
    fresh, resumed = costs(record, f"fresh{procs}", procs), costs(record, f"resumed{procs}", procs)
    result = {}
    for rank in range(procs):
        save, start, resume = fresh[rank]["save"], fresh[rank]["start"], resumed[rank]["resume"]
        for key in ("seconds", "read", "written"):
            result.setdefault(f"save_{key}", []).append(save[key])
            result.setdefault(f"resume_{key}", []).append(resume[key] - start[key])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    cli = parser.parse_args()
    params = cli.width * cli.hidden + cli.hidden + cli.hidden + 1
    print(f"MLP {cli.width}-{cli.hidden}-1: {params:,} parameters ({params * 4 / 2**20:.2f} MiB fp32; AdamW state x2)")
    print("| processes | save: process 0 s / read / written | save: others (mean) | resume - fresh start: "
          "process 0 s / read / written | resume: others (mean) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for procs in cli.procs:
            r = measure(procs, cli.width, cli.hidden, Path(tmp))
            print(f"| {procs} | {cell(r, 'save', slice(0, 1))} | {cell(r, 'save', slice(1, None))} | "
                  f"{cell(r, 'resume', slice(0, 1))} | {cell(r, 'resume', slice(1, None))} |", flush=True)


def cell(result: dict[str, list[float]], kind: str, ranks: slice) -> str:
    """Seconds / KiB read / KiB written of ``kind``, the mean over the processes ``ranks``."""
    mean = [statistics.mean(result[f"{kind}_{k}"][ranks]) for k in ("seconds", "read", "written")]
    return f"{mean[0]:.2f} s / {mean[1] / 1024:,.0f} KiB / {mean[2] / 1024:,.0f} KiB"


if __name__ == "__main__":
    main()
