"""A 2-process run (torchrun, gloo) in which process 1 fails on purpose, for tests/test_process_failures.py.

``--fail`` says how and where, at ``--step``: ``kill`` (SIGKILL at the end of the step: process 0 is then in the
logged-loss average), ``kill-in-save`` (SIGKILL while writing the step's checkpoint), ``kill-in-eval`` (SIGKILL
inside the step's evaluation), ``raise-and-stay`` (a Python exception that the script catches, after which the
process sleeps instead of exiting: the others must not wait for it), ``hang`` (the process stops responding:
sleeps inside the step). Every process writes ``result-RANK.json`` in ``--workdir`` (what stopped it, and when).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.common.models import ClassificationDataset, DropoutMLP  # noqa: E402
from trainwell import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--workdir", required=True)
parser.add_argument("--fail", choices=("none", "kill", "kill-in-save", "kill-in-eval", "raise-and-stay", "hang"))
parser.add_argument("--step", type=int, default=3)
parser.add_argument("--timeout", type=int, default=600, help="ddp_timeout")
parser.add_argument("--resume", action="store_true")
cli = parser.parse_args()
RANK = int(os.environ["RANK"])
FAILS = RANK == 1 and cli.fail != "none"


class Fail(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if FAILS and state.global_step == cli.step:
            if cli.fail == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if cli.fail == "raise-and-stay":
                raise RuntimeError(f"boom at step {state.global_step}")
            if cli.fail == "hang":
                time.sleep(120)


if FAILS and cli.fail == "kill-in-save":
    from trainwell.checkpoint import contents

    write = contents.save_rng_and_data_position

    def dying(trainer, directory, provided):
        if f"checkpoint-{cli.step}" in str(directory):
            os.kill(os.getpid(), signal.SIGKILL)
        write(trainer, directory, provided)

    contents.save_rng_and_data_position = dying


class Trained(Trainer):
    def prediction_step(self, *args, **kwargs):
        if FAILS and cli.fail == "kill-in-eval" and self.state.global_step == cli.step:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().prediction_step(*args, **kwargs)


args = TrainingArguments(output_dir=cli.workdir, use_cpu=True, report_to="none", disable_tqdm=True, max_steps=6,
                         per_device_train_batch_size=4, save_strategy="steps", save_steps=2, eval_strategy="steps",
                         eval_steps=3, logging_steps=1, ddp_timeout=cli.timeout)
start = time.monotonic()
result = {"rank": RANK}
try:
    trainer = Trained(model=DropoutMLP(), args=args, train_dataset=ClassificationDataset(n=96),
                      eval_dataset=ClassificationDataset(n=40), callbacks=[Fail()])
    trainer.train(resume_from_checkpoint=True if cli.resume else None)
    result.update(step=trainer.state.global_step)
except Exception as err:  # noqa: BLE001 - reported to the test
    result.update(error=type(err).__name__, message=str(err), seconds=round(time.monotonic() - start, 1))
os.makedirs(cli.workdir, exist_ok=True)
with open(os.path.join(cli.workdir, f"result-{RANK}.json"), "w") as fh:  # a file each: printed lines interleave
    json.dump(result, fh)
if FAILS and cli.fail == "raise-and-stay":
    time.sleep(120)  # a notebook or a search loop that caught the error and goes on
sys.exit(1 if "error" in result else 0)  # the launcher then stops any process still running
