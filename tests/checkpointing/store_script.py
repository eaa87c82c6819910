"""A training run into an object store, for tests/test_object_store.py.

``python store_script.py OUTPUT_DIR STAGING RESULT [flags]``: trains the regression model 6 steps, saving every 2,
into OUTPUT_DIR (a URL, or a local folder for the uninterrupted baseline). ``--stall-upload checkpoint-N``: the
upload of that checkpoint stops before its manifest (every other file is up) and writes ``STAGING/stalled`` so the
test can kill it there. ``--per-rank-staging``: each process stages into ``STAGING/rank{N}`` (nodes that share no
disk). ``--resume``: ``train(resume_from_checkpoint=True)``. Process 0 writes RESULT (weights, losses, resumed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from tests.common.models import RegressionDataset, RegressionModel  # noqa: E402
from tests.conftest import make_args  # noqa: E402
from trainwell import Trainer  # noqa: E402
from trainwell.checkpoint import store  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("staging")
    parser.add_argument("result")
    parser.add_argument("--stall-upload", default=None)
    parser.add_argument("--per-rank-staging", action="store_true")
    parser.add_argument("--resume", action="store_true")
    cli = parser.parse_args()
    output_dir, staging, result, stall = cli.output_dir, cli.staging, cli.result, cli.stall_upload
    if cli.per_rank_staging:
        staging = os.path.join(staging, f"rank{os.environ.get('RANK', '0')}")
    if stall is not None:
        original = store.FsspecStore.upload

        def upload(self, folder, name):
            if name == stall:
                put_file = self.fs.put_file

                def stalled(lpath, rpath, *args, **kwargs):
                    if rpath.endswith("checkpoint_manifest.json"):
                        Path(staging, "stalled").write_text(name)
                        time.sleep(600)  # killed here: every file is up but the manifest
                    return put_file(lpath, rpath, *args, **kwargs)

                self.fs.put_file = stalled
            return original(self, folder, name)

        store.FsspecStore.upload = upload
    torch.manual_seed(0)
    args = make_args(output_dir, max_steps=6, per_device_train_batch_size=8, logging_steps=1, save_strategy="steps",
                     save_steps=2, output_staging_dir=staging if "://" in output_dir else None)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset())
    trainer.train(resume_from_checkpoint=True if cli.resume else None)
    if trainer.is_world_process_zero():
        losses = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
        resumed = trainer.checkpointer.resume.path if trainer.checkpointer.resume is not None else None
        torch.save({"a": trainer.model.a.detach(), "b": trainer.model.b.detach(), "losses": losses,
                    "resumed": resumed}, result)


if __name__ == "__main__":
    main()
