"""Import cost: ``from trainwell import Trainer, TrainingArguments`` over a bare ``import torch``.

Each measurement is a fresh interpreter; the median over several runs is reported, with the same
measurement for ``transformers`` when it is installed.

    python benchmarks/import_time.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def timed(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


def median_time(code: str, repeats: int) -> float:
    timed(code)  # warm the file cache
    return statistics.median(timed(code) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    cli = parser.parse_args()
    base = median_time("import torch", cli.repeats)
    print(f"import torch: {base:.3f} s (median of {cli.repeats})")
    candidates = {"trainwell": "import torch; from trainwell import Trainer, TrainingArguments"}
    try:
        import importlib.util

        if importlib.util.find_spec("transformers") is not None:
            candidates["transformers"] = "import torch; from transformers import Trainer, TrainingArguments"
    except ImportError:
        pass
    for name, code in candidates.items():
        total = median_time(code, cli.repeats)
        print(f"{name}: {total:.3f} s, {total - base:+.3f} s over import torch")


if __name__ == "__main__":
    main()
