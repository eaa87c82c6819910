"""The lab of ``reliability_damaged.py``: one library's training runs, each forked from a controller that imported
the library once (a crash or a signal ends only that run), the models they train, and how a finished run is
classified (a clear error before any step, a fall-back, a silent resume, a crash, a hang, code that ran).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_bad_input import recorded  # noqa: E402
from reliability_common import (  # noqa: E402
    Blobs,
    Forked,
    WideMLP,
    checkpoint_dirs,
    compare,
    load,
    training_args,
    weights,
)

STEPS, SAVE_STEPS, DAMAGED = 8, 2, 4
RAW = {"TypeError", "AttributeError", "KeyError", "IndexError", "ZeroDivisionError", "UnboundLocalError",
       "NameError", "AssertionError", "OverflowError", "RecursionError"}
TIMEOUT_S = 300
MANIFEST = "checkpoint_manifest.json"


# ------------------------------------------------------------------------------------------------ foreign models
class TLinear(nn.Module):
    """A linear layer keeping its weight as (in, out): ``nn.Linear``'s sizes, the transposed shape."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_in, d_out) * d_in**-0.5)
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class TransposedMLP(WideMLP):
    """WideMLP's six parameters, in its order and sizes; the weights (768, 32) and (8, 768) transposed."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(TLinear(32, 768), nn.ReLU(), nn.Dropout(0.1), TLinear(768, 768), nn.ReLU(),
                                 TLinear(768, 8))


MODELS = {"wide": WideMLP, "transposed": TransposedMLP, "small": lambda: WideMLP(hidden=16)}


# ------------------------------------------------------------------------------------------------ one run (a child)
def _write_json(path: str, obj: dict) -> None:
    with open(path + ".part", "w") as fh:
        json.dump(obj, fh)
    os.replace(path + ".part", path)


def _drop_dac_capabilities() -> None:
    """Root without CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER: file permissions apply to it as to any
    owner, so a ``chmod a-w`` folder cannot be written (it still reads what root owns, the interpreter included).
    Raises OSError when the kernel refuses."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    drop = ~((1 << 1) | (1 << 2) | (1 << 3))  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
    data[0].effective &= drop
    data[0].permitted &= drop
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def run_child(job: dict) -> None:
    """One training run in a forked child: what happened goes to ``job['status']`` (JSON) as it happens, the final
    weights to ``job['result']``; stdout and stderr (glibc's heap messages too) to ``job['log']``."""
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ["LIBC_FATAL_STDERR_"] = "1"  # glibc's "malloc(): corrupted ..." to stderr, not the terminal
    info = {"phase": "construction", "start_step": None, "first_step": None, "steps": 0, "warnings": []}
    if job.get("unprivileged"):
        _drop_dac_capabilities()
    if job.get("probe"):  # a read-only folder: check that this process really cannot write it
        try:
            open(os.path.join(job["out"], ".probe"), "w").close()
            os.remove(os.path.join(job["out"], ".probe"))
            info["writable"] = True
            _write_json(job["status"], info)
            return
        except OSError:
            pass
    lib = load(job["library"])
    logging.getLogger("trainwell").setLevel(logging.WARNING)
    if job["library"] == "transformers":
        sys.modules["transformers"].logging.set_verbosity_warning()

    class Watch(lib.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            info["start_step"] = state.global_step
            info["phase"] = "train"
            _write_json(job["status"], info)

        def on_step_begin(self, args, state, control, **kwargs):
            if info["first_step"] is None:
                info["first_step"] = state.global_step
            info["phase"] = "step"
            _write_json(job["status"], info)

        def on_step_end(self, args, state, control, **kwargs):
            info["steps"] += 1
            info["phase"] = "between steps"  # saving, logging, evaluating
            _write_json(job["status"], info)

    if job.get("start_at"):  # two processes started at the same instant
        time.sleep(max(0.0, job["start_at"] - time.time()))
    with recorded() as seen:
        try:
            torch.manual_seed(0)  # the initial weights of model_and_data()
            model, data = MODELS[job.get("model", "wide")](), Blobs()
            args = training_args(lib, job["out"], **{"max_steps": STEPS, "save_strategy": "steps", **job["overrides"]})
            trainer = lib.Trainer(model=model, args=args, train_dataset=data, callbacks=[Watch()])
            info["phase"] = "train()"
            trainer.train(resume_from_checkpoint=job["resume"])
            torch.save(weights(trainer.model), job["result"])
            info["done"] = True
        except Exception as err:  # noqa: BLE001 - classifying every failure is the point
            info["error"] = {"type": type(err).__name__, "line": (str(err).splitlines() or [""])[0][:400]}
        info["warnings"] = [m[:400] for m in seen()][:30]
    _write_json(job["status"], info)


# ------------------------------------------------------------------------------------------------ the controller
class Lab:
    """One library's runs, forked from its controller (the library imported once)."""

    def __init__(self, library: str) -> None:
        self.library = library
        self.work = Path(tempfile.mkdtemp(prefix=f"reliability-damaged-{library}-"))
        self.io = self.work / "io"  # each child's status, log and final weights
        self.io.mkdir()
        self.count = 0
        self.foreign: dict[str, Path] = {}

    def start(self, out: Path, resume=None, **job) -> tuple[Forked, dict]:
        self.count += 1
        name = f"run{self.count}"
        job = {"library": self.library, "out": str(out), "resume": resume, "overrides": {"save_steps": SAVE_STEPS},
               **{k: str(self.io / f"{name}{x}") for k, x in (("status", ".json"), ("result", ".pt"),
                                                               ("log", ".log"))}, **job}
        return Forked(run_child, job), job

    def finish(self, handle: Forked, job: dict) -> dict:
        """The child's status, return code, the tail of its log and its final weights (None when it ended none)."""
        deadline = time.monotonic() + TIMEOUT_S
        while handle.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        hang = handle.poll() is None
        if hang:
            handle.kill(signal.SIGKILL)
        rc = handle.wait()
        try:
            info = json.loads(Path(job["status"]).read_text())
        except (OSError, ValueError):
            info = {}
        log = Path(job["log"]).read_text(errors="replace")[-3000:] if os.path.exists(job["log"]) else ""
        result = torch.load(job["result"]) if info.get("done") else None
        return {"rc": rc, "hang": hang, "info": info, "log": log, "weights": result}

    def run(self, out: Path, resume=None, **job) -> dict:
        return self.finish(*self.start(out, resume, **job))

    def baseline(self) -> None:
        """The uninterrupted run: its checkpoints are the cases' material, its weights the reference answer."""
        self.base = self.work / "base"
        done = self.run(self.base)
        if done["weights"] is None:
            raise RuntimeError(f"the uninterrupted run failed: {done['info']} {done['log'][-2000:]}")
        self.base_weights = done["weights"]

    def foreign_optimizer(self, kind: str) -> Path:
        """``optimizer.pt`` of a 2-step run of another model (``transposed`` or ``small``), saved by this library."""
        if kind not in self.foreign:
            out = self.work / f"foreign-{kind}"
            done = self.run(out, model=kind, overrides={"save_steps": 2, "max_steps": 2})
            if done["weights"] is None:
                raise RuntimeError(f"the {kind} model's run failed: {done['info']} {done['log'][-2000:]}")
            self.foreign[kind] = out / "checkpoint-2" / "optimizer.pt"
        return self.foreign[kind]

    def copy(self, name: str, manifest: bool) -> Path:
        """A copy of the uninterrupted run's folder with checkpoint-2 and checkpoint-4 only."""
        out = self.work / name / "out"
        shutil.copytree(self.base, out)
        for step, path in checkpoint_dirs(out):
            if step > DAMAGED:
                shutil.rmtree(path)
            elif not manifest:  # as the reference writes it: no manifest, no training_args.json
                (path / MANIFEST).unlink(missing_ok=True)
                (path / "training_args.json").unlink(missing_ok=True)
        return out


# ------------------------------------------------------------------------------------------------ classifying
def _short(text: str, work: Path) -> str:
    return text.replace(str(work) + os.sep, "").replace(str(work), "<tmp>")


def first_line(err: dict, work: Path) -> str:
    return _short(f"{err['type']}: {err['line']}", work)


def where_in_run(info: dict) -> str:
    """Where in the run a failure happened: before any step, in step K, or after step K (saving, logging)."""
    if info.get("first_step") is None:
        return "before any step"
    last = info["first_step"] + info.get("steps", 0)
    return f"in step {last + 1}" if info.get("phase") == "step" else f"after step {last}"


def classify(done: dict, lab: Lab, marker: Path | None = None) -> tuple[str, str]:
    """(category, detail) of one finished run resumed from the damaged ``checkpoint-4``."""
    info, rc = done["info"], done["rc"]
    if marker is not None and marker.exists():
        return "code ran", f"{marker.name} created; exit code {rc}"
    if done["hang"]:
        return "hang", f"no end in {TIMEOUT_S} s"
    if rc < 0:
        heap = re.search(r"^.*(malloc|free\(\)|corrupted|double free).*$", done["log"], re.M)
        return f"crash: {signal.Signals(-rc).name} {where_in_run(info)}", heap.group(0).strip() if heap else ""
    err = info.get("error")
    if err is not None:
        line, where = first_line(err, lab.work), where_in_run(info)
        if err["type"] in RAW:
            return f"crash: raw {err['type']} {where}", line
        if where == "before any step":
            return "clear error before any step", line
        return f"{err['type']} {where}", line
    if done["weights"] is None:
        return f"crash: exit code {rc}", _short(done["log"].strip()[-300:], lab.work)
    equal, diff = compare(done["weights"], lab.base_weights)
    start = info.get("first_step") if info.get("first_step") is not None else info.get("start_step")
    about = [w for w in info.get("warnings", []) if f"checkpoint-{DAMAGED}" in w or "checkpoint" in w.lower()]
    said = f"; {_short(about[0], lab.work)}" if about else ""
    outcome = "bit-equal" if equal else f"final weights differ by {diff:.1e}"
    if isinstance(start, int) and start < DAMAGED and about:
        verdict = "verified" if equal else "NOT equal"
        return f"fell back to checkpoint-{start} with a warning, {verdict}", f"{outcome}{said}"
    if equal:
        return "resumed, bit-equal (the change was not read)", f"started at step {start!r}{said}"
    kind = "resumed with a warning" if about else "resumed silently"
    return f"{kind} ({outcome})", f"started at step {start!r}{said}"
