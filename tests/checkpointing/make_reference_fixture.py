"""Regenerate tests/fixtures/reference_checkpoint/ with the reference Trainer (``transformers``).

Run with an interpreter that has ``transformers`` installed (not trainwell's venv)::

    /work/refvenv/bin/python tests/checkpointing/make_reference_fixture.py

It trains ``RegressionModel`` for 16 steps (GA 2, AdamW, linear schedule), keeps the reference's
``checkpoint-6`` (mid-epoch) minus ``training_args.bin`` (a pickle, which trainwell never loads), and
records the reference's own final weights in ``expected.json`` so a trainwell resume can be compared.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from transformers import Trainer, TrainingArguments  # noqa: E402

from tests.common.models import RegressionDataset, RegressionModel  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "reference_checkpoint")
KEEP = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=0.1,
            optim="adamw_torch", weight_decay=0.01, num_train_epochs=2, logging_steps=1, save_steps=6,
            report_to="none", disable_tqdm=True, use_cpu=True, seed=42,
        )
        trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=64))
        trainer.train()
        shutil.rmtree(FIXTURE, ignore_errors=True)
        os.makedirs(FIXTURE)
        for name in KEEP:
            shutil.copy(os.path.join(tmp, "checkpoint-6", name), os.path.join(FIXTURE, name))
        expected = {
            "a": trainer.model.a.item(), "b": trainer.model.b.item(), "global_step": trainer.state.global_step,
            "losses": {str(h["step"]): h["loss"] for h in trainer.state.log_history if "loss" in h},
            "args": {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "learning_rate": 0.1,
                     "optim": "adamw_torch", "weight_decay": 0.01, "num_train_epochs": 2, "seed": 42,
                     "length": 64},
        }
        with open(os.path.join(FIXTURE, "expected.json"), "w") as fh:
            json.dump(expected, fh, indent=2, sort_keys=True)
    print("wrote", sorted(os.listdir(FIXTURE)))


if __name__ == "__main__":
    main()
