"""A 2-process run (torchrun, gloo) in which process 1 stops making progress, for tests/test_step_timeout.py.

``--stall`` says where, at ``--step``: ``callback`` (process 1 sleeps in ``on_step_end``: process 0 goes on into the
next step's gradient all-reduce and waits there), ``loader`` (process 1's dataset sleeps while the step's batch is
read), ``collective`` (process 1's forward never returns, so it never enters the gradient all-reduce process 0 waits
in). ``step_timeout`` is 3 s. Every process that returns writes ``result-RANK.json`` in ``--workdir``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.common.models import ClassificationDataset, DropoutMLP  # noqa: E402
from trainwell import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--workdir", required=True)
parser.add_argument("--stall", choices=("none", "callback", "loader", "collective"), default="none")
parser.add_argument("--step", type=int, default=3)
parser.add_argument("--timeout", default="3")
cli = parser.parse_args()
RANK = int(os.environ["RANK"])
STALLS = RANK == 1 and cli.stall != "none"


class SleepInCallback(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if STALLS and cli.stall == "callback" and state.global_step == cli.step:
            time.sleep(120)


class SlowData(ClassificationDataset):
    """Sleeps when the first sample of step ``--step`` is read (batches of 4 per process, no workers)."""

    reads = 0

    def __getitem__(self, i):
        SlowData.reads += 1
        if STALLS and cli.stall == "loader" and SlowData.reads == 4 * (cli.step - 1) + 1:
            time.sleep(120)
        return super().__getitem__(i)


class NeverReady(Trainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        if STALLS and cli.stall == "collective" and self.state.global_step + 1 == cli.step:
            threading.Event().wait()  # waits for something that never comes, outside any collective
        return super().compute_loss(model, inputs, *args, **kwargs)


args = TrainingArguments(output_dir=cli.workdir, use_cpu=True, report_to="none", disable_tqdm=True, max_steps=8,
                         per_device_train_batch_size=4, save_strategy="steps", save_steps=2, logging_steps=1,
                         dataloader_num_workers=0, step_timeout=cli.timeout)
start = time.monotonic()
result = {"rank": RANK}
try:
    trainer = NeverReady(model=DropoutMLP(), args=args, train_dataset=SlowData(n=96), callbacks=[SleepInCallback()])
    trainer.train()
    result.update(step=trainer.state.global_step)
except Exception as err:  # noqa: BLE001 - reported to the test
    result.update(error=type(err).__name__, message=str(err), seconds=round(time.monotonic() - start, 1))
os.makedirs(cli.workdir, exist_ok=True)
with open(os.path.join(cli.workdir, f"result-{RANK}.json"), "w") as fh:
    json.dump(result, fh)
sys.exit(1 if "error" in result else 0)
