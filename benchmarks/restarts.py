"""Do torchrun's elastic restarts (``--max-restarts``) come up, and does the restarted run end exactly?

One node, ``torchrun --nproc_per_node 2 --max-restarts 1`` with the static rendezvous (torchrun's default) or c10d,
training ``tests/distributed/multinode_script.py`` (a dropout MLP, 10 steps, a checkpoint every 2, the script passing
``get_last_checkpoint(output_dir)`` as docs/scaling.md says). Process 1 SIGKILLs itself at the end of step 7; torchrun
restarts both processes, which resume ``checkpoint-6``. A try counts when the restart finishes and every process's
weights equal the uninterrupted run's bit for bit. Each try is killed after ``--timeout`` seconds (a hang).

    .venv/bin/python benchmarks/restarts.py [--tries 10] [--rendezvous static c10d] [--timeout 180]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.common.multinode import launch_one_node  # noqa: E402

RUN = ("--steps", "10", "--save-steps", "2", "--resume-last")


def _why(launch) -> str:
    if launch.agent_logs[0].endswith("[timed out]"):
        return "hung (killed at the time limit)"
    text = "\n".join(launch.process_logs.values())  # the processes' own errors, not torchrun's summary
    lines = [line for line in text.splitlines() if "Error" in line and "frame" not in line]
    return lines[-1][:200] if lines else f"rc {launch.returncodes[0]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--rendezvous", nargs="+", default=["static", "c10d"], choices=["static", "c10d"])
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    cli = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="restarts-"))
    baseline = launch_one_node(root / "baseline", root / "baseline-report", *RUN, timeout=cli.timeout)
    assert baseline.ok, baseline.explain()
    weights = baseline.reports[0]["params"]
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for kind in cli.rendezvous:
        good = 0
        for i in range(cli.tries):
            start = time.monotonic()
            run = launch_one_node(root / f"{kind}-{i}", root / f"{kind}-{i}-report", *RUN, "--kill-rank", "1",
                                  "--kill-step", "7", rendezvous=kind, max_restarts=1, timeout=cli.timeout)
            exact = run.ok and len(run.reports) == 2 and all(r.get("params") == weights for r in run.reports.values())
            good += exact
            outcome = "exact" if exact else ("finished, weights differ" if run.ok else _why(run))
            print(f"{kind} try {i + 1}: {outcome} ({time.monotonic() - start:.0f} s, load "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
        print(f"{kind}: {good} of {cli.tries} restarts came up and ended bit-equal", flush=True)
    if cli.keep:
        print("run folders:", root)
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
