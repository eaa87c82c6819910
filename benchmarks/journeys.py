"""How far a batch and a resume travel through trainwell's modules: calls, files and module crossings.

Two journeys, traced with ``sys.setprofile`` on a tiny model (CPU, one process):

* **batch**: the calls that carry the training data, from ``Trainer.train()`` to the first
  ``optimizer.step()``: every trainwell function that receives the ``train_dataset``, or anything made from
  it (the loader, its iterator, samples, batches, the loss), as an argument. What such a call returns is
  followed too.
* **resume**: the calls that carry the checkpoint being resumed (its path, or an object holding the path),
  from ``Trainer.train(resume_from_checkpoint=True)`` to the first ``training_step`` of the resumed run.

For each it prints those trainwell calls (``calls``), the trainwell files they live in (``files``), the
calls that cross from one trainwell file into another (``file crossings``), those that cross from one part
of the architecture into another (``component crossings``: a package such as ``loop/`` or ``data/``, or the
Trainer's files), and the crossings between the loops and the Trainer files (``loop <-> trainer``: from
``trainwell/loop/`` into a Trainer file, or back). Only
trainwell's own code counts; torch, accelerate and the test model do not. This is a structure measure, not a
speed one: the numbers are the same on every machine.

    python benchmarks/journeys.py [--verbose]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import trainwell
from trainwell import Trainer, TrainingArguments

PACKAGE = Path(trainwell.__file__).resolve().parent


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.linear(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def dataset(n: int = 64) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(4, generator=g), "labels": torch.randn((), generator=g)} for _ in range(n)]


def _relative(filename: str) -> str | None:
    if filename.startswith("<"):
        return None  # generated code (dataclass __init__, namedtuples) and frozen modules
    path = Path(filename).resolve()
    try:
        return f"trainwell/{path.relative_to(PACKAGE).as_posix()}"
    except ValueError:
        return None


def _is_trainer_file(name: str) -> bool:
    return name == "trainwell/trainer.py" or name.startswith("trainwell/trainer_")


def component(name: str) -> str:
    """The part of the architecture a file belongs to: a package (``loop``, ``data``...), or the Trainer."""
    if _is_trainer_file(name):
        return "trainer"
    parts = name.split("/")
    return parts[1] if len(parts) > 2 else parts[1].removesuffix(".py")


_PLAIN = (bool, int, float, complex, type(None))


class Journey:
    """Records the trainwell calls that carry a tracked object, until ``stop(frame)`` says the destination is reached.

    A call carries the object when one of its arguments (or an item of a list, tuple or dict argument) is
    tracked. With ``follow_returns``, what a carrying call returns is tracked from then on (taint tracking:
    the dataset, the loader built over it, its iterators, samples, batches, and what is computed from them).
    """

    def __init__(self, stop: Callable[[Any], bool], tracked: Callable[[Any], bool] | None = None,
                 follow_returns: bool = False) -> None:
        self.stop = stop
        self.tracked_ids: set[int] = set()
        self.keep_alive: list[Any] = []  # tracked objects stay alive, so their ids are never reused
        self.tracked = tracked or (lambda value: id(value) in self.tracked_ids)
        self.follow_returns = follow_returns
        self.carrying: set[int] = set()  # frames of carrying calls (ids), to track their return values
        self.calls: list[tuple[str | None, str, str]] = []  # (caller file, callee file, function)
        self.done = False

    def track(self, value: Any) -> None:
        if not isinstance(value, _PLAIN + (str,)) and id(value) not in self.tracked_ids:
            self.tracked_ids.add(id(value))
            self.keep_alive.append(value)

    def _carries(self, frame: Any) -> bool:
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04)
                                  + bool(code.co_flags & 0x08)]
        for name in names:
            value = frame.f_locals.get(name)
            items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
            if self.tracked(value) or any(self.tracked(item) for item in items):
                return True
        return False

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if self.done:
            return
        if event == "return":
            if id(frame) in self.carrying:
                self.carrying.discard(id(frame))
                if self.follow_returns:
                    self.track(arg)
            return
        if event != "call":
            return
        if self.stop(frame):
            self.done = True
            return
        if not self._carries(frame):
            return
        self.carrying.add(id(frame))
        callee = _relative(frame.f_code.co_filename)
        if callee is None:
            return
        caller = frame.f_back
        while caller is not None and _relative(caller.f_code.co_filename) is None:
            caller = caller.f_back  # through torch / accelerate frames to the trainwell code that called them
        caller_file = _relative(caller.f_code.co_filename) if caller is not None else None
        self.calls.append((caller_file, callee, frame.f_code.co_qualname))

    def report(self, name: str, verbose: bool) -> dict[str, int]:
        files = {callee for _, callee, _ in self.calls}
        crossings = [(a, b, f) for a, b, f in self.calls if a is not None and a != b]
        round_trips = [
            (a, b, f) for a, b, f in crossings
            if (a.startswith("trainwell/loop/") and _is_trainer_file(b))
            or (_is_trainer_file(a) and b.startswith("trainwell/loop/"))
        ]
        between = [(a, b) for a, b, _ in crossings if component(a) != component(b)]
        result = {"calls": len(self.calls), "files": len(files), "file crossings": len(crossings),
                  "component crossings": len(between), "loop <-> trainer": len(round_trips)}
        print(f"{name:7s} " + "  ".join(f"{k}: {v}" for k, v in result.items()))
        if verbose:
            for a, b, f in crossings:
                print(f"    {a} -> {b} :: {f}")
        return result


def _trace(journey: Journey, fn: Callable[[], Any]) -> None:
    sys.setprofile(journey)
    try:
        fn()
    finally:
        sys.setprofile(None)


def make_trainer(output_dir: str, max_steps: int) -> Trainer:
    args = TrainingArguments(output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=8,
                             gradient_accumulation_steps=2, save_steps=2, logging_steps=1, report_to="none",
                             disable_tqdm=True)
    torch.manual_seed(0)
    return Trainer(model=Model(), args=args, train_dataset=dataset())


def at_optimizer_step(frame: Any) -> bool:
    return frame.f_code.co_name == "step" and isinstance(frame.f_locals.get("self"), torch.optim.Optimizer)


def at_training_step(frame: Any) -> bool:
    return frame.f_code.co_name == "training_step"


def names_a_checkpoint(value: Any, depth: int = 2) -> bool:
    """The checkpoint being resumed, in any of its forms: a path, or a ``trainwell.checkpoint`` object holding one,
    directly (trainwell's Resume) or through another such object (the run's Checkpointer, holding the Resume)."""
    if isinstance(value, (str, os.PathLike)):
        return "checkpoint-" in os.fspath(value)
    attributes = getattr(value, "__dict__", None)
    if depth == 0 or not isinstance(attributes, dict) or not type(value).__module__.startswith("trainwell.checkpoint"):
        return False
    return any(names_a_checkpoint(v, depth - 1) for v in attributes.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="list every module crossing")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as warm:  # a first run imports what train() imports lazily
        make_trainer(warm, 2).train()
        make_trainer(warm, 4).train(resume_from_checkpoint=True)
    with tempfile.TemporaryDirectory() as out:
        batch = Journey(at_optimizer_step, follow_returns=True)
        first = make_trainer(out, 2)
        batch.track(first.train_dataset)
        _trace(batch, first.train)
        batch.report("batch", ns.verbose)
        resume = Journey(at_training_step, tracked=names_a_checkpoint)
        second = make_trainer(out, 4)
        _trace(resume, lambda: second.train(resume_from_checkpoint=True))
        assert os.path.isdir(os.path.join(out, "checkpoint-4")), "the resumed run did not finish"
        resume.report("resume", ns.verbose)


if __name__ == "__main__":
    main()
