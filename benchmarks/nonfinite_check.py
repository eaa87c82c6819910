"""What a finite check of the gradients costs, per way of doing it (skip_nonfinite_steps; docs/resilience.md).

trainwell's guard reuses the gradient norm every step already takes (for clipping, or for the logs when clipping
is off) and adds only scalar kernels. This script times, over one model's worth of gradients, what the other ways
would add if that norm were not there: the norm itself (one read of every gradient), GradScaler's fused check
(``_amp_foreach_non_finite_check_and_unscale_``: a read and a write of every gradient), a per-tensor ``isfinite``
reduction, and the scalar decision the guard runs (``x * 0 != 0`` on the norm plus the loss).

    python benchmarks/nonfinite_check.py [--params 50_000_000] [--tensors 200] [--device cpu|cuda] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _time(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=50_000_000)
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=20)
    cli = parser.parse_args()
    device = torch.device(cli.device)
    size = cli.params // cli.tensors
    grads = [torch.randn(size, device=device) for _ in range(cli.tensors)]
    norm = torch.nn.utils.get_total_norm(grads)
    loss = torch.tensor(2.3, device=device)
    found = torch.zeros((), device=device)
    one = torch.ones((), device=device)
    ways = {
        "the guard's decision, on the norm the step has (scalar kernels)": lambda: torch.ne((norm + loss) * 0, 0,
                                                                                             out=found),
        "a gradient norm (torch.nn.utils.get_total_norm)": lambda: torch.nn.utils.get_total_norm(grads),
        "GradScaler's check (_amp_foreach_non_finite_check_and_unscale_, scale 1)":
            lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found, one),
        "isfinite().all() per tensor, stacked": lambda: torch.stack([g.isfinite().all() for g in grads]).all(),
    }
    print(f"{cli.params:,} gradient values in {cli.tensors} tensors on {device} (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads); median of {cli.repeats}")
    for name, fn in ways.items():
        print(f"  {_time(fn, cli.repeats, device) * 1e3:9.3f} ms  {name}")


if __name__ == "__main__":
    main()
