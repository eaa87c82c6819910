"""A checkpoint file swapped by another process while trainwell loads it: how many loads read the swapped-in file?

A ``checkpoint-2/`` holds ``model.safetensors`` (a 64x64 weight and a bias, all 1.0) and its manifest. A second
process renames, in a tight loop, two files over ``model.safetensors`` in turn: the good file, and either

1. ``link``: a symbolic link to a file outside the run (all 7.0), or
2. ``file``: a regular file of the same size (all 7.0), which only the manifest's checksum tells apart.

Meanwhile this process loads the weights ``--loads`` times: ``read_model_weights`` alone (``link``), or the
manifest's check first and then ``read_model_weights`` (``file``: the resume's order). Each load ends as ``other``
(the swapped-in weights were loaded: the race won), ``good``, or ``refused`` (an error naming the file: a link, or
bytes that do not match the manifest). The target is 0 ``other``.

Run it against another checkout (the code before the fix) with ``PYTHONPATH=that/checkout``.

    .venv/bin/python benchmarks/reliability_swap.py [--loads 2000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path and "PYTHONPATH" not in os.environ:
    sys.path.insert(0, ROOT)

_SWAPPER = """
import os, sys
target, stop, first, second, kind = sys.argv[1:6]
temp = os.path.join(os.path.dirname(first), ".swap")
open(os.path.join(os.path.dirname(stop), "started"), "w").close()
while not os.path.exists(stop):
    for source in (first, second):
        if os.path.lexists(temp):
            os.unlink(temp)
        if kind == "link" and source == second:
            os.symlink(source, temp)
        else:
            os.link(source, temp)
        os.replace(temp, target)
"""


def _weights(value: float) -> dict[str, torch.Tensor]:
    return {"net.weight": torch.full((64, 64), value), "net.bias": torch.full((64,), value)}


def race(kind: str, loads: int) -> dict[str, float]:
    from safetensors.torch import save_file

    from trainwell.checkpoint import manifest
    from trainwell.checkpoint.io import read_model_weights
    from trainwell.checkpoint.resume import manifest_problem

    with tempfile.TemporaryDirectory() as where:
        folder, spare = Path(where) / "checkpoint-2", Path(where) / "spare"
        folder.mkdir()
        spare.mkdir()
        save_file(_weights(1.0), str(folder / "model.safetensors"))
        manifest.write(folder, manifest.build(folder, []))
        os.link(folder / "model.safetensors", spare / "good.safetensors")
        save_file(_weights(7.0), str(spare / "other.safetensors"))
        swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(folder / "model.safetensors"),
                                    str(spare / "stop"), str(spare / "good.safetensors"),
                                    str(spare / "other.safetensors"), kind])
        while not (spare / "started").exists():
            time.sleep(0.01)
        counts: dict[str, float] = {"other": 0, "good": 0, "refused": 0}
        start = time.perf_counter()
        try:
            for _ in range(loads):
                try:
                    if kind == "file" and manifest_problem(folder) is not None:
                        counts["refused"] += 1
                        continue
                    bias = read_model_weights(folder)["net.bias"]
                except (OSError, ValueError):
                    counts["refused"] += 1
                    continue
                counts["other" if bias[0].item() == 7.0 else "good"] += 1
        finally:
            (spare / "stop").touch()
            swapper.wait(timeout=60)
        counts["seconds"] = round(time.perf_counter() - start, 1)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=2000)
    args = parser.parse_args()
    import trainwell

    print(f"trainwell from {os.path.dirname(trainwell.__file__)}")
    for kind in ("link", "file"):
        print(f"{kind}: {args.loads} loads -> {race(kind, args.loads)}")


if __name__ == "__main__":
    main()
