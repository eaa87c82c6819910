"""SIGTERM with ``enable_jit_checkpoint=True`` (a preempted job): how fast the process exits, which step it saves,
and whether resuming from that checkpoint gives the uninterrupted run's weights.

A seeded run (``reliability_common.WideMLP``, batch 16, 300 steps, no save strategy, ~10 ms of extra work per step
so the run lasts a few seconds) starts in a fresh interpreter; ``--repeats`` times, SIGTERM is sent at a random
moment 0-0.5 s after step 30. Measured: the time from the signal to the end of ``train()`` and to the process's
exit, the last step completed before the signal against the step of the checkpoint written, the exit code, whether
that checkpoint is whole (every file read back), and, in a fresh process that resumes from it (trainwell with
``resume_from_checkpoint=True``, the reference with ``get_last_checkpoint(output_dir)``), whether the run ends
bit-equal to an uninterrupted one. The reference waits ``kill_wait`` = 3 s after SIGTERM before it checkpoints.

    .venv/bin/python benchmarks/reliability_sigterm.py [--repeats 3] [--steps 300] [--seed 0]
                                                       [--library trainwell|transformers|both]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_common import (  # noqa: E402
    ROOT,
    add_library_flag,
    checkpoint_dirs,
    checkpoint_problem,
    child_env,
    compare,
    describe_diff,
    load,
    model_and_data,
    print_table,
    selected,
    training_args,
    version,
    weights,
)

STEP_WORK_S = 0.01
SIGNAL_AFTER_STEP = 30


def run(library: str, out: str, status: str, result: str, steps: int, jit: bool, resume: bool) -> None:
    """One training run in this process; ``status`` gets the last completed step and when ``train()`` returned."""
    torch.set_num_threads(1)
    lib = load(library)

    class Progress(lib.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            with open(status + ".part", "w") as fh:
                fh.write(str(state.global_step))
            os.replace(status + ".part", status)
            time.sleep(STEP_WORK_S)  # the rest of a step's work

    model, data = model_and_data()
    args = training_args(lib, out, max_steps=steps, enable_jit_checkpoint=jit)
    trainer = lib.Trainer(model=model, args=args, train_dataset=data, callbacks=[Progress()])
    target = None
    if resume:
        target = True if library == "trainwell" else lib.get_last_checkpoint(out)
    trainer.train(resume_from_checkpoint=target)
    returned = time.time()
    torch.save({"weights": weights(trainer.model), "step": trainer.state.global_step, "returned": returned}, result)


def _start(library: str, out: str, name: str, steps: int, jit: bool = False, resume: bool = False):
    status, result = os.path.join(out + f".{name}.status"), os.path.join(out + f".{name}.pt")
    cmd = [sys.executable, os.path.abspath(__file__), "--run", library, out, status, result, str(steps),
           str(jit), str(resume)]
    proc = subprocess.Popen(cmd, env=child_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    return proc, status, result


def _finish(proc, what: str) -> None:
    _, stderr = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{stderr[-3000:]}")


def _step(status: str) -> int:
    try:
        with open(status) as fh:
            return int(fh.read() or 0)
    except FileNotFoundError:
        return 0


def measure(library: str, repeats: int, steps: int, seed: int) -> dict:
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix=f"reliability-sigterm-{library}-")
    base_proc, _, base_result = _start(library, os.path.join(work, "base"), "base", steps)
    _finish(base_proc, "the uninterrupted run")
    base = torch.load(base_result)["weights"]
    rows = []
    for i in range(repeats):
        out = os.path.join(work, f"run{i}")
        proc, status, result = _start(library, out, "first", steps, jit=True)
        while _step(status) < SIGNAL_AFTER_STEP and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.5))
        at_signal = _step(status)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=600)
        exited = time.time()
        saved = [step for step, _ in checkpoint_dirs(out)]
        row = {"at_signal": at_signal, "saved": saved, "rc": proc.returncode, "exit_s": exited - sent,
               "train_s": (torch.load(result)["returned"] - sent) if os.path.exists(result) else None,
               "whole": all(checkpoint_problem(p) is None for _, p in checkpoint_dirs(out)) if saved else None,
               "error": stderr.strip().splitlines()[-1] if proc.returncode else None, "equal": None, "diff": None}
        if saved and proc.returncode == 0:
            again, _, again_result = _start(library, out, "resumed", steps, resume=True)
            _finish(again, "the resumed run")
            row["equal"], row["diff"] = compare(torch.load(again_result)["weights"], base)
        rows.append(row)
    shutil.rmtree(work, ignore_errors=True)
    return {"rows": rows, "version": version(library)}


def report(results: dict[str, dict], cli) -> None:
    libs = list(results)
    print(f"\n== SIGTERM with enable_jit_checkpoint=True, {cli.repeats} runs each: {cli.steps} steps of ~"
          f"{STEP_WORK_S * 1e3:.0f} ms + compute, signal 0-0.5 s after step {SIGNAL_AFTER_STEP} "
          f"(CPU, torch {torch.__version__}) ==")

    def times(r: dict, key: str) -> str:
        values = [row[key] for row in r["rows"] if row[key] is not None]
        if not values:
            return "n/a"
        return f"{statistics.median(values):.2f} s (" + ", ".join(f"{v:.2f}" for v in values) + ")"

    rows = [
        ("signal -> train() returned, median (each)", *[times(r, "train_s") for r in results.values()]),
        ("signal -> process exit, median (each)", *[times(r, "exit_s") for r in results.values()]),
        ("last step before the signal -> step saved", *[", ".join(
            f"{row['at_signal']}->{'/'.join(map(str, row['saved'])) or 'none'}" for row in r["rows"])
            for r in results.values()]),
        ("exit codes", *[", ".join(str(row["rc"]) for row in r["rows"]) for r in results.values()]),
        ("checkpoint whole", *[", ".join({True: "yes", False: "NO", None: "none"}[row["whole"]] for row in r["rows"])
                               for r in results.values()]),
        ("resumed run vs uninterrupted", *[", ".join(describe_diff(row["equal"], row["diff"]) for row in r["rows"])
                                           for r in results.values()]),
    ]
    print_table(rows, libs, {lib: results[lib]["version"] for lib in libs})
    for lib, r in results.items():
        for row in r["rows"]:
            if row["error"]:
                print(f"  {lib}: exit {row['rc']}: {row['error'][:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_library_flag(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run", nargs=7, help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.run:
        library, out, status, result, steps, jit, resume = cli.run
        run(library, out, status, result, int(steps), jit == "True", resume == "True")
        return
    results = {}
    for lib in selected(cli.library):
        start = time.perf_counter()
        results[lib] = measure(lib, cli.repeats, cli.steps, cli.seed)
        print(f"{lib}: done in {time.perf_counter() - start:.0f} s", flush=True)
    report(results, cli)


if __name__ == "__main__":
    main()
