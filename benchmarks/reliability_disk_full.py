"""A disk that fills up during a checkpoint save: the error each library gives, whether the earlier checkpoints
stay intact, what the failed save leaves behind, and whether resuming once space is freed gives the uninterrupted
run's weights.

The run of ``reliability_kill.py`` (``WideMLP``, batch 16, 160 steps, a ~7.5 MB checkpoint every 4 steps) writes
to a real full disk: a tmpfs (``mount -t tmpfs``: needs root) where a filler file leaves room for 3 checkpoints and
``FRACTION`` of the 4th, so the save at step 16 runs out of space after that fraction of its bytes (0.2: in
``model.safetensors``; 0.6: in ``optimizer.pt``; 1.0: one 4 KiB page short, in the last small files). Then the
filler is deleted (space freed) and the run is restarted as a user's script would (trainwell with
``resume_from_checkpoint=True``, the reference with ``get_last_checkpoint(output_dir)``); a restart that fails is
counted and the checkpoint it tried is deleted by hand before the next one. Reported: the exception ``train()``
raised, whether checkpoints 4, 8 and 12 are still whole (every file read back) and hold the uninterrupted run's
weights, the folder the failed save left, the failed restarts, and the final weights against an uninterrupted run on
the ordinary disk.

Each library runs in a fresh interpreter, each training run in a process forked from it (as in
``reliability_kill.py``).

    .venv/bin/python benchmarks/reliability_disk_full.py [--fractions 0.2 0.6 1.0]
                                                         [--library trainwell|transformers|both]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_common import (  # noqa: E402
    Forked,
    add_library_flag,
    answer,
    checkpoint_dirs,
    checkpoint_problem,
    compare,
    describe_diff,
    load,
    print_table,
    run_controller,
    selected,
)
from reliability_kill import train_once  # noqa: E402

STEPS, SAVE_STEPS, GOOD_SAVES = 160, 4, 3
PAGE = 4096


@contextlib.contextmanager
def tmpfs(path: str, size: int):
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False, capture_output=True)


def folder_bytes(folder) -> int:
    """Bytes the folder's files take on tmpfs (whole pages)."""
    return sum(-(-p.stat().st_size // PAGE) * PAGE for p in folder.rglob("*") if p.is_file())


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Scenario:
    def __init__(self, library: str, work: str) -> None:
        self.library, self.work = library, work

    def train(self, out: str, name: str, resume: bool) -> tuple[int, dict]:
        status, result = os.path.join(self.work, f"{name}.status"), os.path.join(self.work, f"{name}.pt")
        for path in (status, result):
            if os.path.exists(path):
                os.remove(path)
        code = Forked(train_once, self.library, out, status, result, STEPS, SAVE_STEPS, resume).wait()
        info = {}
        with contextlib.suppress(FileNotFoundError, ValueError), open(status) as fh:
            info = json.load(fh)
        return code, info

    def baseline(self) -> tuple[dict, str, int]:
        out = os.path.join(self.work, "base")
        code, _ = self.train(out, "base", resume=False)
        if code != 0:
            raise RuntimeError("the uninterrupted run failed")
        checkpoint = dict(checkpoint_dirs(out))[SAVE_STEPS]
        return torch.load(os.path.join(self.work, "base.pt")), out, folder_bytes(checkpoint)

    def run(self, fraction: float, base: dict, base_out: str, size: int) -> dict:
        mount = os.path.join(self.work, f"disk-{fraction}")
        total = (STEPS // SAVE_STEPS + 4) * size + (32 << 20)  # room for every checkpoint once the filler is gone
        with tmpfs(mount, total):
            out = os.path.join(mount, "run")
            filler = os.path.join(mount, "filler")
            room = int((GOOD_SAVES + fraction) * size) - (PAGE if fraction >= 1 else 0)
            with open(filler, "wb") as fh:
                os.posix_fallocate(fh.fileno(), 0, free_bytes(mount) - room)
            code, info = self.train(out, "run", resume=False)
            error = info.get("error", "none: train() returned") if code == 0 else info.get("error", f"exit {code}")
            failed_at = info.get("step")
            earlier = {}
            base_dirs = dict(checkpoint_dirs(base_out))
            for step, path in checkpoint_dirs(out):
                problem = checkpoint_problem(path)
                if problem is None:  # whole: the same weights as the uninterrupted run's at that step?
                    from safetensors.torch import load_file

                    same, _ = compare(load_file(str(path / "model.safetensors")),
                                      load_file(str(base_dirs[step] / "model.safetensors")))
                    problem = None if same else "weights differ from the uninterrupted run's"
                earlier[step] = problem
            left = sorted(name for name in os.listdir(out) if name.startswith(".tmp")
                          or (name.startswith("checkpoint-") and earlier.get(int(name.split("-")[1]))))
            os.remove(filler)  # space freed
            failures = []
            for _ in range(10):
                code, info = self.train(out, "resumed", resume=bool(checkpoint_dirs(out)))
                if code == 0:
                    break
                failures.append(info.get("error", f"exit {code}").replace(out + os.sep, ""))
                newest = checkpoint_dirs(out)
                shutil.rmtree(info.get("chosen") or newest[-1][1])  # deleted by hand
            equal, diff = (None, None)
            if code == 0:
                equal, diff = compare(torch.load(os.path.join(self.work, "resumed.pt")), base)
        return {"fraction": fraction, "error": error.replace(out + os.sep, ""), "failed_at": failed_at,
                "earlier": {str(k): v for k, v in earlier.items()}, "left": left, "failures": failures,
                "equal": equal, "diff": diff}


def controller(library: str, fractions: list[float]) -> dict:
    load(library)  # imported once, before any fork
    work = tempfile.mkdtemp(prefix=f"reliability-disk-full-{library}-")
    try:
        scenario = Scenario(library, work)
        base, base_out, size = scenario.baseline()
        runs = [scenario.run(fraction, base, base_out, size) for fraction in fractions]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"runs": runs, "checkpoint_bytes": size, "version": load(library).version}


def report(results: dict[str, dict], fractions: list[float]) -> None:
    libs = list(results)
    size = next(iter(results.values()))["checkpoint_bytes"]
    print(f"\n== Disk full during the save of step {(GOOD_SAVES + 1) * SAVE_STEPS} (tmpfs; checkpoints of "
          f"~{size / 2**20:.1f} MB every {SAVE_STEPS} steps), then space freed and the run restarted ==")
    for i, fraction in enumerate(fractions):
        runs = {lib: results[lib]["runs"][i] for lib in libs}
        part = f"{fraction:.0%} of the next" if fraction < 1 else "all but 4 KiB of the next"
        print(f"\n-- room for {GOOD_SAVES} checkpoints and {part} --")

        def earlier(r: dict) -> str:
            old = {int(k): v for k, v in r["earlier"].items() if int(k) <= GOOD_SAVES * SAVE_STEPS}
            bad = [f"{k}: {v}" for k, v in old.items() if v]
            return f"{len(old) - len(bad)} of {GOOD_SAVES} whole, same weights" + (f"; {bad}" if bad else "")

        rows = [
            ("train() raised", *[r["error"].split(":")[0] for r in runs.values()]),
            ("at step", *[r["failed_at"] for r in runs.values()]),
            ("checkpoints 4, 8, 12", *[earlier(r) for r in runs.values()]),
            ("left by the failed save", *[", ".join(r["left"]) or "nothing" for r in runs.values()]),
            ("restarts that failed (checkpoint deleted by hand)", *[len(r["failures"]) for r in runs.values()]),
            ("final weights vs the uninterrupted run", *[describe_diff(r["equal"], r["diff"]) for r in runs.values()]),
        ]
        print_table(rows, libs, {lib: results[lib]["version"] for lib in libs})
        for lib, r in runs.items():
            for failure in r["failures"]:
                print(f"  {lib}, failed restart: {failure[:160]}")
            print(f"  {lib}, train() raised: {r['error'][:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_library_flag(parser)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.2, 0.6, 1.0],
                        help="how much of the 4th checkpoint fits before the disk is full")
    parser.add_argument("--controller", action="store_true", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.controller:
        answer(controller(cli.library, cli.fractions))
        return
    if os.geteuid() != 0:
        sys.exit("reliability_disk_full.py mounts a small tmpfs (a disk that really fills up): run it as root.")
    results = {}
    for lib in selected(cli.library):
        start = time.perf_counter()
        results[lib] = run_controller(os.path.abspath(__file__), ["--controller", "--library", lib, "--fractions",
                                                                  *map(str, cli.fractions)])
        print(f"{lib}: done in {time.perf_counter() - start:.0f} s", flush=True)
    report(results, cli.fractions)


if __name__ == "__main__":
    main()
