"""The cost of an object-store output_dir: how long each checkpoint's upload takes, and how much of it the training
loop waits for, synchronous and with ``save_async=True``, as a share of one optimizer step.

A moto S3 server is started on 127.0.0.1 (``python -m moto.server``, spoken to through s3fs as AWS would be); the
model is an ``nn.Sequential`` of ``--layers`` ``Linear(--width, --width)`` with AdamW (a checkpoint of about
``12 x layers x width^2`` bytes). One ``train()`` of ``--steps`` steps without saves gives the step time; then
runs save every ``--every`` steps into a local folder, into ``s3://bench/run`` synchronously, and into it with
``save_async=True``. A Trainer subclass times each ``_save_checkpoint`` call (the loop's wait), and
``FsspecStore.upload`` is timed too (the upload itself, on whichever thread runs it). Reported: medians over the
saves after the first. The server is local, so the upload's time is the client's and the server's work, not a
network's: a real store adds its bandwidth (``checkpoint bytes / bandwidth``) to the upload, which ``save_async``
keeps off the loop. Nothing is asserted.

    python benchmarks/store_upload.py [--layers 8] [--width 1024] [--steps 24] [--every 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.common import s3server  # noqa: E402
from trainwell import Trainer, TrainingArguments  # noqa: E402
from trainwell.checkpoint import store  # noqa: E402


class Vectors(Dataset):
    def __init__(self, width: int, n: int = 4096) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, width, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i]}


class Net(nn.Module):
    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])

    def forward(self, x):
        return {"loss": self.body(x).pow(2).mean()}


class Timed(Trainer):
    waits: list[float] = []

    def _save_checkpoint(self, model, trial):
        start = time.perf_counter()
        super()._save_checkpoint(model, trial)
        Timed.waits.append(time.perf_counter() - start)


def run(cli, output_dir: str, staging: str | None, saves: bool, save_async: bool = False) -> float:
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=output_dir, output_staging_dir=staging, max_steps=cli.steps,
                             per_device_train_batch_size=8, save_strategy="steps" if saves else "no",
                             save_steps=cli.every, save_async=save_async, report_to="none", disable_tqdm=True,
                             use_cpu=True, logging_steps=10_000)
    trainer = Timed(model=Net(cli.layers, cli.width), args=args, train_dataset=Vectors(cli.width))
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=4)
    cli = parser.parse_args()
    uploads: list[float] = []
    original = store.FsspecStore.upload

    def timed_upload(self, folder, name):
        start = time.perf_counter()
        original(self, folder, name)
        uploads.append(time.perf_counter() - start)

    store.FsspecStore.upload = timed_upload
    srv = s3server.S3Server().start()
    os.environ.update(srv.env())
    srv.client().create_bucket(Bucket="bench")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            no_saves = run(cli, os.path.join(tmp, "plain"), None, saves=False)
            step = no_saves / cli.steps
            rows = []
            for name, url, save_async in (("local folder, synchronous", os.path.join(tmp, "local"), False),
                                          ("s3 (moto), synchronous", "s3://bench/sync", False),
                                          ("s3 (moto), save_async=True", "s3://bench/async", True)):
                Timed.waits.clear()
                uploads.clear()
                staging = os.path.join(tmp, "stage-" + url.rsplit("/", 1)[-1]) if url.startswith("s3") else None
                total = run(cli, url, staging, saves=True, save_async=save_async)
                wait = statistics.median(Timed.waits[1:] or Timed.waits)
                up = statistics.median(uploads[1:] or uploads) if uploads else None
                rows.append((name, wait, up, total))
            size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(os.path.join(tmp, "local",
                                                                                            "checkpoint-4"))
                       for f in fs)
    finally:
        srv.stop()
    print(f"model: {cli.layers} x Linear({cli.width}, {cli.width}); checkpoint {size / 2**20:.1f} MiB; "
          f"step {step * 1000:.1f} ms (train() without saves: {no_saves:.2f} s for {cli.steps} steps)")
    print(f"{'configuration':32} {'loop waits per save':>22} {'upload per checkpoint':>24} {'train() total':>14}")
    for name, wait, up, total in rows:
        upload = f"{up:.3f} s ({up / step:.1f} steps)" if up is not None else "-"
        print(f"{name:32} {wait:.3f} s ({wait / step:5.1f} steps) {upload:>24} {total:12.2f} s")


if __name__ == "__main__":
    main()
