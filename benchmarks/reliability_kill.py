"""SIGKILL at random moments, many of them inside a checkpoint save: what is left on disk, and does resuming work?

One seeded training run (``reliability_common.WideMLP``: 0.62M parameters, ~7.5 MB per checkpoint with its AdamW
state; batch 16, 160 steps over 4 epochs, a checkpoint every 4 steps) is SIGKILLed ``--kills`` times. Half the
kills are timed (a random delay after the restarted run's first step); the other half are aimed inside a save: the
parent polls the output folder for a save in progress (trainwell's ``.tmp-checkpoint-N``, the reference's
``checkpoint-N`` without ``trainer_state.json``, which it writes last) and kills 0-10 ms after seeing it. Whether a
kill landed inside a save is judged afterwards from what it left.

After each kill the run restarts as a user's script would: trainwell with ``resume_from_checkpoint=True``, the
reference with ``resume_from_checkpoint=get_last_checkpoint(output_dir)`` (its example scripts). A restart that
fails is counted, and the checkpoint it tried is deleted by hand before the next attempt (what a user must do).
After each kill every ``checkpoint-N`` folder is read back completely (an independent check: every file present
and loadable, ``trainer_state.json``'s step right). When all kills are made, the run finishes and its final
weights are compared with an uninterrupted run of the same library (bit-equal, or the max abs difference).

Each library runs in its own fresh interpreter; there, each training run is a process forked from that interpreter
after the library is imported (a fresh interpreter costs 5-15 s of imports on a busy 2-core machine; a SIGKILL, what
it leaves and the resume that follows are those of any process). ``--procs 2`` runs the 2-process variant instead:
each run is ``torchrun --nproc_per_node 2`` (gloo, CPU), and a kill SIGKILLs the launcher and both workers at once
(each worker individually: torchrun gives each its own session).

    .venv/bin/python benchmarks/reliability_kill.py [--kills 20] [--procs 1|2] [--steps 160] [--save-steps 4]
                                                    [--seed 0] [--library trainwell|transformers|both]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_common import (  # noqa: E402
    Forked,
    Launched,
    add_library_flag,
    answer,
    checkpoint_dirs,
    checkpoint_problem,
    compare,
    describe_diff,
    incomplete_entries,
    load,
    model_and_data,
    print_table,
    run_controller,
    selected,
    training_args,
    weights,
)


# ------------------------------------------------------------------------------------------------ one training run
def _write_json(path: str, obj: dict) -> None:
    with open(path + ".part", "w") as fh:
        json.dump(obj, fh)
    os.replace(path + ".part", path)  # the parent never reads half a file


def train_once(library: str, out: str, status: str, result: str, steps: int, save_steps: int, resume: bool) -> None:
    """Train (resuming as the library's users do when ``resume``); rank 0 reports progress in ``status``."""
    lib = load(library)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    chosen = lib.get_last_checkpoint(out) if resume else None  # trainwell: the newest complete one
    info = {"chosen": chosen, "resumed_step": None, "step": None}

    class Progress(lib.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if info["resumed_step"] is None and rank0:
                info["resumed_step"] = state.global_step
                _write_json(status, info)

        def on_step_end(self, args, state, control, **kwargs):
            if rank0:
                info["step"] = state.global_step
                _write_json(status, info)

    model, data = model_and_data()
    args = training_args(lib, out, max_steps=steps, save_strategy="steps", save_steps=save_steps)
    trainer = lib.Trainer(model=model, args=args, train_dataset=data, callbacks=[Progress()])
    target = (True if library == "trainwell" else chosen) if resume else None
    try:
        trainer.train(resume_from_checkpoint=target)
    except Exception as err:
        if rank0:
            _write_json(status, {**info, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:400]}"})
        raise
    if trainer.is_world_process_zero():
        torch.save(weights(trainer.model), result)


# ------------------------------------------------------------------------------------------------ the kill chain
class Chain:
    """One library's kill chain, run by a controller process that imported the library."""

    def __init__(self, cli) -> None:
        self.cli, self.rng = cli, random.Random(cli.seed)
        self.work = tempfile.mkdtemp(prefix=f"reliability-kill-{cli.library}-")
        self.stats = {"kills": 0, "in_save": 0, "resumes": 0, "failed": [], "wrong_step": 0, "broken": [],
                      "ended_early": False}

    def start(self, name: str, resume: bool):
        out, status, result = (os.path.join(self.work, f"{name}{x}") for x in ("", ".status", ".pt"))
        for path in (status, result):
            if os.path.exists(path):
                os.remove(path)
        argv = [self.cli.library, out, status, result, self.cli.steps, self.cli.save_steps, resume]
        if self.cli.procs == 1:
            return Forked(train_once, *argv)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(self.cli.procs), os.path.abspath(__file__), "--worker", *map(str, argv)]
        return Launched(cmd)

    def status(self, name: str) -> dict:
        try:
            with open(os.path.join(self.work, f"{name}.status")) as fh:
                return json.load(fh)
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def wait_first_step(self, handle, name: str, timeout: float = 600) -> dict | None:
        """The status once the run's first step began; None if it exited first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.status(name)
            if info.get("resumed_step") is not None:
                return info
            if handle.poll() is not None:
                return None
            time.sleep(0.002)
        handle.kill(signal.SIGKILL)
        raise TimeoutError(f"{name}: no step in {timeout} s")

    def start_resumed(self):
        """(a running handle past its first step, the time it was started), or (None, _) when the run is done."""
        out = os.path.join(self.work, "run")
        for _ in range(50):
            resume = bool(checkpoint_dirs(out))
            spawned = time.time()
            handle = self.start("run", resume)
            info = self.wait_first_step(handle, "run")
            self.stats["resumes"] += resume
            if info is not None:
                chosen = info.get("chosen")
                if chosen and info["resumed_step"] != int(chosen.rsplit("-", 1)[1]):
                    self.stats["wrong_step"] += 1
                return handle, spawned
            if handle.wait() == 0:
                return None, spawned  # nothing left to train
            info = self.status("run")
            error = info.get("error", f"exit code {handle.returncode}").replace(out + os.sep, "")
            self.stats["failed"].append(error)
            newest = checkpoint_dirs(out)
            victim = info.get("chosen") or (str(newest[-1][1]) if newest else None)
            if victim is None:
                raise RuntimeError("a run failed with no checkpoint to blame: " + str(self.stats["failed"][-1]))
            shutil.rmtree(victim)  # "deleted by hand", so that the next restart can resume from an older one
        raise RuntimeError("50 restarts in a row failed")

    def run(self) -> dict:
        t0 = time.perf_counter()
        base = self.start("base", False)
        if self.wait_first_step(base, "base") is None:
            raise RuntimeError("the uninterrupted run failed before its first step")
        first = time.perf_counter()
        if base.wait() != 0:
            raise RuntimeError("the uninterrupted run failed")
        train_s = time.perf_counter() - first
        chunk = 2 * train_s / (self.cli.kills + 2)  # timed kills: ~half the run is trained between kills
        plans = ["save"] * ((self.cli.kills + 1) // 2) + ["timed"] * (self.cli.kills // 2)
        self.rng.shuffle(plans)
        out = os.path.join(self.work, "run")
        broken_before: set[str] = set()
        for plan in plans:
            handle, spawned = self.start_resumed()
            if handle is None:
                self.stats["ended_early"] = True
                break
            deadline = time.monotonic() + (self.rng.uniform(0, chunk) if plan == "timed" else 300)
            while time.monotonic() < deadline and handle.poll() is None:
                if plan == "save" and incomplete_entries(out, since=spawned):
                    time.sleep(self.rng.uniform(0, 0.010))
                    break
                time.sleep(0.001)
            if handle.poll() is not None:
                self.stats["ended_early"] = True
                break
            handle.kill(signal.SIGKILL)
            handle.wait()
            self.stats["kills"] += 1
            self.stats["in_save"] += bool(incomplete_entries(out, since=spawned))
            broken = {p.name: problem for _, p in checkpoint_dirs(out) if (problem := checkpoint_problem(p))}
            fresh = [name for name in broken  # newly broken, or rewritten by this run
                     if name not in broken_before or os.stat(os.path.join(out, name)).st_mtime >= spawned]
            self.stats["broken"] += [f"{name}: {broken[name]}" for name in fresh]
            broken_before = set(broken)
        handle, _ = self.start_resumed()
        if handle is not None and handle.wait() != 0:
            raise RuntimeError(f"the final run failed: {self.status('run')}")
        equal, diff = compare(torch.load(os.path.join(self.work, "run.pt")),
                              torch.load(os.path.join(self.work, "base.pt")))
        final = checkpoint_dirs(out)
        leftovers = sorted(name for name in os.listdir(out) if name.startswith(".tmp"))
        result = {**self.stats, "equal": equal, "diff": diff, "checkpoints": len(final),
                  "broken_at_end": sum(checkpoint_problem(p) is not None for _, p in final),
                  "tmp_left": leftovers, "train_s": train_s, "wall_s": time.perf_counter() - t0,
                  "version": load(self.cli.library).version}
        shutil.rmtree(self.work, ignore_errors=True)
        return result


# ------------------------------------------------------------------------------------------------ the parent
def report(results: dict[str, dict], cli) -> None:
    libs = list(results)
    print(f"\n== SIGKILL x{cli.kills}, {cli.procs}-process run: {cli.steps} steps, a checkpoint every "
          f"{cli.save_steps} (~7.5 MB each), seed {cli.seed} (CPU, torch {torch.__version__}) ==")
    get = lambda key: [results[lib][key] for lib in libs]  # noqa: E731
    rows = [
        ("kills made (inside a save)", *[f"{r['kills']} ({r['in_save']})" for r in results.values()]),
        ("checkpoint-N folders found broken after a kill", *[len(r["broken"]) for r in results.values()]),
        ("restarts that resumed / failed", *[f"{r['resumes'] - len(r['failed'])} / {len(r['failed'])}"
                                             for r in results.values()]),
        ("resumed at a step other than the checkpoint's", *get("wrong_step")),
        ("checkpoints at the end (broken)", *[f"{r['checkpoints']} ({r['broken_at_end']})"
                                               for r in results.values()]),
        ("final weights vs the uninterrupted run", *[describe_diff(r["equal"], r["diff"]) for r in results.values()]),
        ("uninterrupted training / whole chain, s", *[f"{r['train_s']:.1f} / {r['wall_s']:.0f}"
                                                       for r in results.values()]),
    ]
    print_table(rows, libs, {lib: results[lib]["version"] for lib in libs})
    for lib, r in results.items():
        if r["ended_early"]:
            print(f"  {lib}: the run reached its last step before every kill was made")
        for what, items in (("broken", r["broken"]), ("failed resume", r["failed"])):
            for item in sorted(set(items))[:4]:
                print(f"  {lib}, {what}: {item}" + (f"  (x{items.count(item)})" if items.count(item) > 1 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_library_flag(parser)
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs per library (half aimed inside a save)")
    parser.add_argument("--procs", type=int, choices=[1, 2], default=1, help="2: torchrun --nproc_per_node 2 (gloo)")
    parser.add_argument("--steps", type=int, default=160)
    parser.add_argument("--save-steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--controller", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.worker:  # one torchrun worker
        library, out, status, result, steps, save_steps, resume = cli.worker
        torch.set_num_threads(1)
        train_once(library, out, status, result, int(steps), int(save_steps), resume == "True")
        return
    if cli.controller:
        load(cli.library)  # imported once, before any fork
        answer(Chain(cli).run())
        return
    results = {}
    for lib in selected(cli.library):
        argv = ["--controller", "--library", lib, "--kills", str(cli.kills), "--procs", str(cli.procs), "--steps",
                str(cli.steps), "--save-steps", str(cli.save_steps), "--seed", str(cli.seed)]
        start = time.perf_counter()
        results[lib] = run_controller(os.path.abspath(__file__), argv)
        print(f"{lib}: done in {time.perf_counter() - start:.0f} s", flush=True)
    report(results, cli)


if __name__ == "__main__":
    main()
