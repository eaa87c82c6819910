"""A damaged, foreign or hostile checkpoint, a shared or a read-only output folder: is the user told before a step?

One seeded run of ``reliability_common.WideMLP`` (batch 16, 8 steps, a checkpoint every 2 steps) is the
uninterrupted run. For each case, a copy of its output folder keeps ``checkpoint-2`` and ``checkpoint-4`` (so that
``checkpoint-4`` is the newest), one thing in ``checkpoint-4`` is changed, and the run is resumed to step 8, once
with ``resume_from_checkpoint=<checkpoint-4>`` and once with ``resume_from_checkpoint=True``:

1. ``model.safetensors``: the low byte of 64 float32 values flipped (bit rot: the length and header intact);
2. ``optimizer.pt`` of a model whose weights have the transposed shapes (same parameters, same sizes);
3. ``optimizer.pt`` of a smaller model with as many parameters (32 -> 16 -> 16 -> 8);
4. ``trainer_state.json``'s ``global_step`` set to 100 (past ``max_steps``), 2 (behind the weights), 6 (ahead), -3;
5. ``global_step`` a string, a float, null, 1e300; ``log_history`` a string;
6. a crafted ``pytorch_model_fsdp_0/.metadata`` or ``optimizer_0/.metadata`` (a pickle calling ``os.system`` to
   create a marker file), beside the normal files or instead of them (one process, no FSDP);
7. an AdamW checkpoint resumed with ``optim="sgd"`` (nothing changed in the folder);
10. a file that is not a regular file: ``optimizer.pt`` a link to ``/dev/zero``, ``rng_state.pth`` a FIFO,
    ``trainer_state.json`` a link to a copy of it outside the folder;
11. the manifest deleted after a byte of the weights was flipped (trainwell's checkpoints only say they have one);
12. ``optimizer.pt`` edited (its manifest with it): a 0-dim ``exp_avg_sq``, a ``step`` of 3 values, ``exp_avg``
    gone, ``lr`` a string;
13. ``rng_state.pth``'s CPU state 10 bytes long, ``scheduler.pt``'s ``base_lrs`` one value too many;
14. the weights stored as float16 (the model trains in float32).

Then two runs on one ``output_dir`` (8: two processes started at the same instant, seeds 7 and 8, a checkpoint
every step, ``--tries`` times; each checkpoint's weights and optimizer state are matched against solo runs of each
seed: whose it is, or mixed), and a
read-only ``output_dir`` (9: the undamaged ``checkpoint-4`` resumed in a folder made read-only with ``chmod -R
a-w``; root writes through permissions, so a child run as root first gives up CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
and CAP_FOWNER, and checks that it cannot write there; when it can, the case says "not measurable as root").

Each outcome is one of: ``clear error before any step`` (an exception before the first step that is not a raw
``TypeError``/``AttributeError``/``KeyError``/...; its type and first line are printed), ``fell back to
checkpoint-K with a warning`` (``True`` resumed an older checkpoint, and the final weights are compared with the
uninterrupted run: ``verified`` when bit-equal), ``resumed, bit-equal`` (the change was not read), ``resumed
silently`` (the run ended on the damaged state: its final weights differ from the uninterrupted run's; ``with a
warning`` when one named a checkpoint), ``<Error> in step K`` / ``after step K`` (any other exception once training
began; "after": while saving or logging), ``crash`` (a raw ``TypeError``/``AttributeError``/``KeyError``/..., or a
signal such as SIGSEGV: a negative return code, with glibc's heap message if it printed one), ``code ran`` (the
marker file exists), ``hang`` (no end in 300 s).

trainwell writes a manifest of checksums into each checkpoint; the reference does not. So trainwell runs each case
twice: on its checkpoints as written, and with ``checkpoint_manifest.json`` removed from every checkpoint (as in a
checkpoint written by the reference, or edited together with its manifest), which exercises the checks behind
the manifest. Each library runs in a fresh interpreter, each training run in a process forked from it (a crash
or a signal ends only that process).

    .venv/bin/python benchmarks/reliability_damaged.py [--tries 5] [--library trainwell|transformers|both]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_common import (  # noqa: E402
    add_library_flag,
    answer,
    checkpoint_dirs,
    checkpoint_problem,
    compare,
    load,
    print_table,
    run_controller,
    selected,
)
from reliability_lab import (  # noqa: E402
    DAMAGED,
    MANIFEST,
    RAW,
    SAVE_STEPS,
    STEPS,
    Lab,
    classify,
    first_line,
    where_in_run,
)


# ------------------------------------------------------------------------------------------------ the damage
def flip_bytes(ckpt: Path, lab: Lab) -> None:
    """The low (mantissa) byte of 64 float32 values in the middle of the data flipped: small, finite changes."""
    path = ckpt / "model.safetensors"
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")  # the header is padded to 8 bytes: values stay aligned
    middle = start + (len(data) - start) // 2 // 4 * 4
    for i in range(middle, middle + 256, 4):
        data[i] ^= 0xFF
    path.write_bytes(data)


def foreign(kind: str):
    def damage(ckpt: Path, lab: Lab) -> None:
        shutil.copyfile(lab.foreign_optimizer(kind), ckpt / "optimizer.pt")

    return damage


def edit_state(**fields):
    def damage(ckpt: Path, lab: Lab) -> None:
        path = ckpt / "trainer_state.json"
        state = json.loads(path.read_text())
        state.update(fields)
        path.write_text(json.dumps(state, indent=2))

    return damage


class Payload:
    """Unpickling this runs ``touch marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def plant(folder: str, keep_normal: bool):
    def damage(ckpt: Path, lab: Lab) -> None:
        (ckpt / folder).mkdir()
        (ckpt / folder / ".metadata").write_bytes(pickle.dumps(Payload(str(ckpt.parent.parent / "CODE_RAN"))))
        if not keep_normal:
            (ckpt / ("model.safetensors" if folder == "pytorch_model_fsdp_0" else "optimizer.pt")).unlink()

    return damage


def _no_change(ckpt: Path, lab: Lab) -> None:
    pass


def not_regular(name: str, kind: str):
    def damage(ckpt: Path, lab: Lab) -> None:
        path = ckpt / name
        if kind == "outside":
            shutil.copyfile(path, ckpt.parent.parent / f"outside-{name}")
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to("/dev/zero" if kind == "dev-zero" else ckpt.parent.parent / f"outside-{name}")

    return damage


def _reseal(ckpt: Path) -> None:
    """An edit made together with the manifest (only for a checkpoint that has one: trainwell's)."""
    if (ckpt / MANIFEST).exists():
        from trainwell.checkpoint import manifest

        manifest.write(ckpt, manifest.build(ckpt, []))


def edit_file(name: str, change):
    def damage(ckpt: Path, lab: Lab) -> None:
        state = torch.load(ckpt / name, weights_only=False)
        change(state)
        torch.save(state, ckpt / name)
        _reseal(ckpt)

    return damage


def flipped_without_manifest(ckpt: Path, lab: Lab) -> None:
    flip_bytes(ckpt, lab)
    (ckpt / MANIFEST).unlink(missing_ok=True)


def half_weights(ckpt: Path, lab: Lab) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(ckpt / "model.safetensors")
    save_file({k: v.half() for k, v in weights.items()}, ckpt / "model.safetensors", metadata={"format": "pt"})
    _reseal(ckpt)


def _first(state: dict) -> dict:
    return state["state"][0]


STATE = "4. trainer_state.json global_step"
TYPES = "5. trainer_state.json field types"
SHARDS = "6. crafted DCP .metadata"
CASES = [  # (group, case, damage, overrides)
    ("1. model.safetensors bytes flipped", "64 low bytes flipped", flip_bytes, {}),
    ("2. optimizer.pt of another shape", "weights transposed, same sizes", foreign("transposed"), {}),
    ("3. optimizer.pt of a smaller model", "32-16-16-8, as many parameters", foreign("small"), {}),
    *[(STATE, f"global_step={v}", edit_state(global_step=v), {}) for v in (100, 2, 6, -3)],
    *[(TYPES, f"global_step={v!r}", edit_state(global_step=v), {}) for v in ("4", 4.0, None, 1e300)],
    (TYPES, "log_history='lost'", edit_state(log_history="lost"), {}),
    *[(SHARDS, f"{folder}/ {where}", plant(folder, keep), {}) for folder in ("pytorch_model_fsdp_0", "optimizer_0")
      for keep, where in ((True, "beside the normal files"), (False, "instead of them"))],
    ("7. AdamW checkpoint, optim='sgd'", "nothing changed", _no_change, {"optim": "sgd"}),
    *[("10. not a regular file", f"{name} {words}", not_regular(name, kind), {}) for name, kind, words in (
        ("optimizer.pt", "dev-zero", "a link to /dev/zero"), ("rng_state.pth", "fifo", "a FIFO"),
        ("trainer_state.json", "outside", "a link out of the folder"))],
    ("11. manifest deleted", "weights flipped, then the manifest deleted", flipped_without_manifest, {}),
    *[("12. optimizer.pt values", case, edit_file("optimizer.pt", change), {}) for case, change in (
        ("0-dim exp_avg_sq", lambda s: _first(s).update(exp_avg_sq=torch.tensor(1.0))),
        ("step of 3 values", lambda s: _first(s).update(step=torch.ones(3))),
        ("exp_avg gone", lambda s: _first(s).pop("exp_avg")),
        ("lr a string", lambda s: s["param_groups"][0].update(lr="fast")))],
    ("13. RNG and scheduler values", "rng_state.pth cpu 10 bytes",
     edit_file("rng_state.pth", lambda s: s.update(cpu=torch.zeros(10, dtype=torch.uint8))), {}),
    ("13. RNG and scheduler values", "scheduler.pt base_lrs too long",
     edit_file("scheduler.pt", lambda s: s.update(base_lrs=[*s["base_lrs"], 0.5])), {}),
    ("14. weights of another dtype", "model.safetensors as float16", half_weights, {}),
]


def checkpoint_cases(lab: Lab, manifest: bool) -> list[dict]:
    rows = []
    for index, (group, case, damage, overrides) in enumerate(CASES):
        for mode in ("path", "True"):
            out = lab.copy(f"{'m' if manifest else 'n'}{index}-{mode}", manifest)
            ckpt = out / f"checkpoint-{DAMAGED}"
            damage(ckpt, lab)
            resume = str(ckpt) if mode == "path" else True
            done = lab.run(out, resume, overrides={"save_steps": SAVE_STEPS, **overrides})
            category, detail = classify(done, lab, out.parent / "CODE_RAN")
            rows.append({"group": group, "case": case, "mode": mode, "category": category, "detail": detail})
    return rows


# ------------------------------------------------------------------------------------------------ two writers
def _moments(state: dict) -> dict[str, torch.Tensor]:
    return {f"{i}.{k}": v for i, s in state["state"].items() for k, v in s.items() if isinstance(v, torch.Tensor)}


def origin(ckpt: Path, solos: dict[str, Path]) -> str:
    """Which solo run's checkpoint of the same step the folder's weights and optimizer state are: ``A``, ``B``,
    ``mixed (...)``, or what is wrong with it."""
    from safetensors.torch import load_file

    problem = checkpoint_problem(ckpt)
    if problem is not None:
        return f"broken ({problem})"
    model, moments = load_file(str(ckpt / "model.safetensors")), _moments(torch.load(ckpt / "optimizer.pt"))
    same_weights, same_moments = set(), set()  # both sets can hold both runs: at step 1 the warmup's lr is 0
    for tag, solo in solos.items():
        ref = solo / ckpt.name
        if compare(model, load_file(str(ref / "model.safetensors")))[0]:
            same_weights.add(tag)
        if compare(moments, _moments(torch.load(ref / "optimizer.pt")))[0]:
            same_moments.add(tag)
    both = sorted(same_weights & same_moments)
    if len(both) == 1:
        return both[0]
    if both:
        return "of either run (identical)"
    show = lambda tags: " or ".join(sorted(tags)) or "neither run"  # noqa: E731
    return f"mixed (weights of {show(same_weights)}, optimizer state of {show(same_moments)})"


def writer_outcome(done: dict, lab: Lab) -> str:
    info, err = done["info"], done["info"].get("error")
    if done["rc"] < 0:
        return f"crash: {signal.Signals(-done['rc']).name} {where_in_run(info)}"
    if err is not None:
        where = "at construction" if info.get("phase") == "construction" else where_in_run(info)
        where = "in train(), before any step" if where == "before any step" else where
        return f"{'crashed' if err['type'] in RAW else 'stopped'} {where}: {first_line(err, lab.work)}"
    return "ran to the end" if info.get("done") else f"exit code {done['rc']}"


def two_writers(lab: Lab, tries: int) -> list[dict]:
    """Two runs (seeds 7 and 8, a checkpoint every step) started at one instant on one output_dir, ``tries``
    times: what each process did, and whose checkpoints the folder holds at the end."""
    seeds, solos, solo_weights = {"A": 7, "B": 8}, {}, {}
    for tag, seed in seeds.items():
        solos[tag] = lab.work / f"solo-{tag}"
        done = lab.run(solos[tag], overrides={"save_steps": 1, "seed": seed})
        if done["weights"] is None:
            raise RuntimeError(f"the solo run {tag} failed: {done['info']}")
        solo_weights[tag] = done["weights"]
    tries_out = []
    for attempt in range(tries):
        out = lab.work / f"shared-{attempt}" / "out"
        start_at = time.time() + 2.0  # both children forked and waiting before either builds its Trainer
        started = {tag: lab.start(out, overrides={"save_steps": 1, "seed": seed}, start_at=start_at)
                   for tag, seed in seeds.items()}
        dones = {tag: lab.finish(*handle) for tag, handle in started.items()}
        outcomes = {tag: writer_outcome(done, lab) for tag, done in dones.items()}
        for tag, done in dones.items():
            if done["weights"] is not None:
                equal, diff = compare(done["weights"], solo_weights[tag])
                outcomes[tag] += ", final weights " + ("equal its solo run's" if equal else f"differ by {diff:.1e}")
        origins = [origin(path, solos) for _, path in checkpoint_dirs(out)]
        counts = {o: origins.count(o) for o in dict.fromkeys(origins)}
        tries_out.append({"processes": outcomes, "checkpoints": counts})
    return tries_out


def writers_verdict(tries: list[dict]) -> str:
    verdicts = []
    for t in tries:
        ran = [tag for tag, o in t["processes"].items() if o.startswith("ran to the end")]
        stopped = [tag for tag, o in t["processes"].items() if re.match(r"stopped (at construction|in train\(\))", o)]
        if len(ran) == 1 and len(stopped) == 1 and set(t["checkpoints"]) == set(ran):
            verdicts.append("one stopped before any step, the other's checkpoints intact")
        elif len(ran) == 2:
            verdicts.append("both ran; the checkpoints: " + ", ".join(
                f"{n} of run {o}" if o in ("A", "B") else f"{n} {o}" for o, n in t["checkpoints"].items()))
        else:
            verdicts.append("; ".join(f"{tag} {o}" for tag, o in t["processes"].items()))
    return " | ".join(f"{v} (x{verdicts.count(v)})" for v in dict.fromkeys(verdicts))


# ------------------------------------------------------------------------------------------------ read-only folder
def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def _chmod_tree(folder: Path, dirs: int, files: int) -> None:
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, dirs if path.is_dir() else files)


def read_only(lab: Lab) -> list[dict]:
    """Resume an undamaged checkpoint-4 into an output_dir this process cannot write (``chmod -R a-w``); as root,
    the child first gives up the capabilities that let root write through permissions. The child checks that it
    really cannot write there: if it can, the case is "not measurable"."""
    unprivileged = os.geteuid() == 0
    rows = []
    for mode in ("path", "True"):
        out = lab.copy(f"ro-{mode}", manifest=True)
        before = _snapshot(out)
        _chmod_tree(out, 0o555, 0o444)
        resume = str(out / f"checkpoint-{DAMAGED}") if mode == "path" else True
        try:
            done = lab.run(out, resume, unprivileged=unprivileged, probe=True)
        finally:
            _chmod_tree(out, 0o755, 0o644)
        if done["info"].get("writable") or "capset failed" in done["log"] or "capget failed" in done["log"]:
            rows.append({"mode": mode, "category": "not measurable as root",
                         "detail": "the child could not give up root's right to write through permissions"})
            continue
        category, detail = classify(done, lab)
        intact = "checkpoints intact" if _snapshot(out) == before else "the folder CHANGED"
        rows.append({"mode": mode, "category": category, "detail": f"{detail}; {intact}"})
    return rows


# ------------------------------------------------------------------------------------------------ the parent
def controller(library: str, tries: int) -> dict:
    torch.set_num_threads(1)
    lib = load(library)  # imported once, before any fork
    lab = Lab(library)
    try:
        lab.baseline()
        columns = {library: checkpoint_cases(lab, manifest=True)}
        if library == "trainwell":
            columns["trainwell, manifest removed"] = checkpoint_cases(lab, manifest=False)
        return {"version": lib.version, "columns": columns, "writers": two_writers(lab, tries),
                "read_only": read_only(lab)}
    finally:
        shutil.rmtree(lab.work, ignore_errors=True)


def report(results: dict[str, dict]) -> None:
    columns = {name: rows for r in results.values() for name, rows in r["columns"].items()}
    versions = {name: r["version"] for lib, r in results.items() for name in r["columns"] if name == lib}
    names = list(columns)
    first = columns[names[0]]
    print(f"\n== checkpoint-4 of an {STEPS}-step run (a checkpoint every {SAVE_STEPS}) changed, then resumed to step "
          f"{STEPS} (CPU, torch {torch.__version__}) ==")
    table, group = [], None
    for i, row in enumerate(first):
        if row["group"] != group:
            group = row["group"]
            table.append((group, *[""] * len(names)))
        table.append((f"  {row['case']} [{row['mode']}]", *[columns[n][i]["category"] for n in names]))
    print_table(table, names, versions)
    print("\nwhat each run said (" + " | ".join(names) + ")")
    for i, row in enumerate(first):
        print(f"  {row['case']} [{row['mode']}]")
        for n in names:
            print(f"    {n}: {columns[n][i]['detail'][:300]}")
    print("\n== per case group: outcomes ==")
    for group in dict.fromkeys(r["group"] for r in first):
        for n in names:
            cats = [re.sub(r" \(final weights differ by [^)]*\)", "", r["category"])  # counted without the number
                    for r in columns[n] if r["group"] == group]
            print(f"  {group} | {n}: " + "; ".join(f"{c} x{cats.count(c)}" for c in dict.fromkeys(cats)))
    print("\n== 8. two runs started at one instant on one output_dir ==")
    for lib, r in results.items():
        print(f"  {lib}: {writers_verdict(r['writers'])}")
        for t in r["writers"]:
            print("    " + " | ".join(f"{tag}: {o[:160]}" for tag, o in t["processes"].items()) + " | checkpoints: "
                  + ", ".join(f"{n} {o}" for o, n in t["checkpoints"].items()))
    print("\n== 9. a read-only output_dir, resumed from checkpoint-4 ==")
    for lib, r in results.items():
        for row in r["read_only"]:
            print(f"  {lib} [{row['mode']}]: {row['category']}: {row['detail'][:300]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_library_flag(parser)
    parser.add_argument("--tries", type=int, default=5, help="two-writer races per library (case 8)")
    parser.add_argument("--controller", action="store_true", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.controller:
        answer(controller(cli.library, cli.tries))
        return
    results = {}
    for lib in selected(cli.library):
        start = time.perf_counter()
        results[lib] = run_controller(os.path.abspath(__file__), ["--controller", "--library", lib, "--tries",
                                                                   str(cli.tries)])
        print(f"{lib}: done in {time.perf_counter() - start:.0f} s", flush=True)
    report(results)


if __name__ == "__main__":
    main()
