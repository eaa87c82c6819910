"""Trained by tests/test_many_ranks.py and benchmarks/many_ranks.py under ``torchrun --nproc_per_node N``.

A tiny model over samples that carry their id: every process records, per optimizer step, the ids it trained on
(``ids_{tag}_rank{R}.jsonl`` in ``--record``, a line per step, written as the step ends so a killed run keeps
them), and what each checkpoint save and the resume cost it (``cost_{tag}_rank{R}.jsonl``: seconds, and bytes
read and written through system calls, from ``/proc/self/io``). ``--kill-at S``: process 0 kills itself with
SIGKILL as step S ends (torchrun then stops the others).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from trainwell import Trainer, TrainerCallback, TrainingArguments  # noqa: E402


class IdData(torch.utils.data.Dataset):
    """``n`` regression samples, each with its ``sample_id`` (its index)."""

    def __init__(self, n: int, width: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, width, generator=generator)
        self.y = torch.randn(n, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i], "sample_id": i}


class IdModel(nn.Module):
    """A small MLP that notes the ids of the samples of each forward pass."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.seen: list[int] = []

    def forward(self, x, labels=None, sample_id=None):
        self.seen += sample_id.tolist()
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def io_counters() -> dict[str, int]:
    """Bytes this process read and wrote through system calls so far (``rchar``, ``wchar``)."""
    with open("/proc/self/io") as fh:
        pairs = dict(line.split(":") for line in fh.read().splitlines())
    return {"read": int(pairs["rchar"]), "written": int(pairs["wchar"])}


class Cost:
    """Seconds and bytes between :meth:`start` and :meth:`stop`."""

    def start(self) -> None:
        self.t0, self.io0 = time.perf_counter(), io_counters()

    def stop(self) -> dict[str, float]:
        io = io_counters()
        return {"seconds": time.perf_counter() - self.t0, "read": io["read"] - self.io0["read"],
                "written": io["written"] - self.io0["written"]}


class Recorder(TrainerCallback):
    def __init__(self, model: IdModel, ids_file: str, cost_file: str, kill_at: int, first: Cost | None,
                 first_name: str):
        self.model, self.kill_at, self.first, self.first_name = model, kill_at, first, first_name
        self.ids = open(ids_file, "a")
        self.cost_file = cost_file

    def on_step_begin(self, args, state, control, **kwargs):
        if self.first is not None:  # train() to its first step: a resume's cost (a fresh run's, to compare)
            cost, self.first = self.first.stop(), None
            self.note({"what": self.first_name, **cost})

    def on_step_end(self, args, state, control, **kwargs):
        self.ids.write(json.dumps({"step": state.global_step, "ids": self.model.seen}) + "\n")
        self.ids.flush()
        self.model.seen = []
        if state.global_step == self.kill_at and state.is_world_process_zero:
            os.kill(os.getpid(), signal.SIGKILL)

    def note(self, record: dict) -> None:
        with open(self.cost_file, "a") as fh:
            fh.write(json.dumps(record) + "\n")


class MeasuredTrainer(Trainer):
    def _save_checkpoint(self, model, trial):
        cost = Cost()
        cost.start()
        super()._save_checkpoint(model, trial)
        self.recorder.note({"what": "save", "step": self.state.global_step, **cost.stop()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", default=None, help="process 0 writes the final step and epoch there (JSON)")
    parser.add_argument("--record", required=True, help="the folder of the ids and cost files (outside output_dir)")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--ga", type=int, default=1)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--resume", default=None)
    cli = parser.parse_args()

    torch.manual_seed(0)
    model = IdModel(cli.width, cli.hidden)
    args = TrainingArguments(
        output_dir=cli.workdir, per_device_train_batch_size=cli.batch, gradient_accumulation_steps=cli.ga,
        learning_rate=0.01, optim="adamw_torch", num_train_epochs=1, save_strategy="steps",
        save_steps=cli.save_steps, logging_steps=1, report_to="none", disable_tqdm=True, use_cpu=True, seed=7,
    )
    rank = int(os.environ.get("RANK", "0"))
    first = Cost()
    trainer = MeasuredTrainer(model=model, args=args, train_dataset=IdData(cli.samples, cli.width))
    os.makedirs(cli.record, exist_ok=True)
    ids_file = os.path.join(cli.record, f"ids_{cli.tag}_rank{rank}.jsonl")
    cost_file = os.path.join(cli.record, f"cost_{cli.tag}_rank{rank}.jsonl")
    trainer.recorder = Recorder(model, ids_file, cost_file, cli.kill_at, first, "resume" if cli.resume else "start")
    trainer.add_callback(trainer.recorder)
    first.start()
    trainer.train(resume_from_checkpoint=cli.resume)
    if cli.out and trainer.is_world_process_zero():
        with open(cli.out, "w") as fh:
            json.dump({"step": trainer.state.global_step, "epoch": trainer.state.epoch}, fh)


if __name__ == "__main__":
    main()
