"""Per-step overhead: trainwell vs a plain PyTorch loop (and transformers when installed), same work.

Both loops train the same tiny MLP on the same in-memory data with the same optimizer (AdamW), the same
linear LR schedule, gradient clipping at 1.0 and the same collate function, so the difference is the
training framework itself. Runs alternate and repeat; the best and the median steps/s of each are reported, with the
overhead relative to the plain loop. Absolute numbers on a shared machine are noise; the ratio is the result.

    python benchmarks/overhead.py [--steps 2000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate

BATCH = 32
D_IN, HIDDEN, N_CLASSES = 32, 128, 10


class Data(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, D_IN, generator=g)
        self.y = torch.randint(0, N_CLASSES, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, N_CLASSES))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def plain_loop(steps: int) -> float:
    torch.manual_seed(0)
    model = MLP()
    data = Data(steps * BATCH)
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, collate_fn=default_collate,
                        generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / steps))
    model.train()
    start = time.perf_counter()
    for batch in loader:
        loss = model(**batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        model.zero_grad(set_to_none=True)
    return steps / (time.perf_counter() - start)


def framework_loop(steps: int, trainer_cls: type, args_cls: type) -> float:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out:
        args = args_cls(output_dir=out, per_device_train_batch_size=BATCH, num_train_epochs=1, learning_rate=1e-3,
                        optim="adamw_torch_fused", save_strategy="no", report_to="none", disable_tqdm=True,
                        logging_steps=500, use_cpu=True)
        trainer = trainer_cls(model=MLP(), args=args, train_dataset=Data(steps * BATCH), data_collator=default_collate)
        with contextlib.redirect_stdout(io.StringIO()):
            start = time.perf_counter()
            trainer.train()
            elapsed = time.perf_counter() - start
    return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    cli = parser.parse_args()

    import trainwell

    runners = {"plain": plain_loop,
               "trainwell": lambda n: framework_loop(n, trainwell.Trainer, trainwell.TrainingArguments)}
    try:
        import transformers

        runners["transformers"] = lambda n: framework_loop(n, transformers.Trainer, transformers.TrainingArguments)
    except ImportError:
        print("transformers is not installed: comparing with the plain loop only", file=sys.stderr)

    for run in runners.values():  # warm-up: imports, allocator, thread pools
        run(200)
    results: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(cli.repeats):
        for name, run in runners.items():
            results[name].append(run(cli.steps))

    # The best run of each is the least disturbed by other work on a shared machine; the median is shown too.
    best_base = max(results["plain"])
    median_base = statistics.median(results["plain"])
    print(f"tiny MLP, batch {BATCH}, {cli.steps} steps, {cli.repeats} interleaved runs each "
          f"(CPU, torch {torch.__version__})")
    for name, values in results.items():
        best, median = max(values), statistics.median(values)
        print(f"  {name:<12} best {best:8.1f} steps/s  overhead {100 * (best_base / best - 1):+6.1f}%   |   "
              f"median {median:8.1f} steps/s  overhead {100 * (median_base / median - 1):+6.1f}%")


if __name__ == "__main__":
    main()
