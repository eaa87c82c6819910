"""Memory of the live page's reading of a long live log (``trainwell report --watch``, issue 39).

Writes a live log of ``--lines`` train logs (an evaluation every 100), then reads it as the live page does
(``LiveLogReader(folder, max_points=LIVE_POINTS)``: older entries thinned) and as before thinning (every entry
kept, ``max_points=None``), each in a fresh process, and prints the growth of the peak RSS and the seconds taken
(with ``--tracemalloc``: the peak of ``tracemalloc`` instead, and times several times longer). Then a log of
``--long-line-mb`` MiB with no newline (less than the 256 MiB read of a log: a longer one is read from its end).

    python benchmarks/live_memory.py [--lines 1000000] [--long-line-mb 200] [--tracemalloc]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_READ = """
import resource, sys, time, tracemalloc
from trainwell.report.live import LiveLogReader
max_points = None if sys.argv[2] == 'all' else int(sys.argv[2])
if sys.argv[3] == 'trace':
    tracemalloc.start()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
reader = LiveLogReader(sys.argv[1], max_points=max_points)
reader.poll()
seconds = time.perf_counter() - start
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
peak = tracemalloc.get_traced_memory()[1] if tracemalloc.is_tracing() else grown
entries = len(reader.history.entries) if reader.history else 0
print(peak, seconds, entries, reader.skipped)
"""


def write_log(path: Path, lines: int) -> None:
    with open(path, "w") as f:
        f.write(json.dumps({"session": {"start_step": 0, "resumed_from": None, "max_steps": lines}, "time": 1.0})
                + "\n")
        for step in range(1, lines + 1):
            f.write(json.dumps({"log": {"loss": 1.0 / step, "grad_norm": 0.5, "learning_rate": 1e-4,
                                        "epoch": step / 1000, "step": step}, "time": 1.0}) + "\n")
            if step % 100 == 0:
                f.write(json.dumps({"log": {"eval_loss": 2.0 / step, "epoch": step / 1000, "step": step},
                                    "time": 1.0}) + "\n")


def measure(folder: Path, max_points: str, trace: bool) -> str:
    out = subprocess.run([sys.executable, "-c", _READ, str(folder), max_points, "trace" if trace else "rss"],
                         check=True, capture_output=True, text=True).stdout.split()
    peak, seconds, entries, skipped = int(out[0]), float(out[1]), int(out[2]), int(out[3])
    what = "tracemalloc peak" if trace else "peak RSS growth"
    return f"{what} {peak / 1e6:.1f} MB, {seconds:.1f} s, {entries} entries kept, {skipped} lines skipped"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--long-line-mb", type=int, default=200)
    parser.add_argument("--tracemalloc", action="store_true")
    ns = parser.parse_args()
    from trainwell.loop.live_log import LIVE_LOG_NAME
    from trainwell.report.watch import LIVE_POINTS

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_log(folder / LIVE_LOG_NAME, ns.lines)
        size = (folder / LIVE_LOG_NAME).stat().st_size
        print(f"{ns.lines:,} lines ({size / 1e6:.0f} MB):")
        print(f"  the live page (max_points={LIVE_POINTS}): {measure(folder, str(LIVE_POINTS), ns.tracemalloc)}")
        print(f"  every entry kept:               {measure(folder, 'all', ns.tracemalloc)}")
        with open(folder / LIVE_LOG_NAME, "wb") as f:
            for _ in range(ns.long_line_mb):
                f.write(b"x" * (1 << 20))
        print(f"{ns.long_line_mb} MiB with no newline: {measure(folder, str(LIVE_POINTS), ns.tracemalloc)}")


if __name__ == "__main__":
    main()
