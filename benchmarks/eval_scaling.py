"""Evaluation time and memory against the number of samples: trainwell beside transformers when available.

``evaluate()`` with ``compute_metrics`` on the full logits of a small language model (sequence 128,
vocabulary 1,000, eval batch 16) for 250, 500, 1,000 and 2,000 samples. Every point runs in a fresh
subprocess, which reports the wall time of ``evaluate()`` and its peak resident memory above the resident
memory just before it (``ru_maxrss`` minus the current RSS), next to the size of the predictions it keeps
(N x 128 x 1,000 float32). Two more modes show the memory of a metric that does not need the full logits:
``argmax`` (``preprocess_logits_for_metrics`` reduces each batch) and ``batch`` (``batch_eval_metrics``).

Nothing is asserted: the script prints times, time per sample, peak memory / predictions kept, and the
transformers / trainwell time ratio.

    python benchmarks/eval_scaling.py [--sizes 250 500 1000 2000] [--modes full argmax batch] [--repeats 3]
                                      [--reference-python /path/to/python-with-transformers]

The reference runs under ``--reference-python`` (or this interpreter when it can import transformers).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

SEQ, VOCAB, DIM, EVAL_BATCH = 128, 1000, 64, 16


def _model_and_data(n: int):
    import torch
    from torch import nn

    class TinyLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, DIM)
            self.head = nn.Linear(DIM, VOCAB)

        def forward(self, input_ids, labels=None):
            logits = self.head(self.emb(input_ids))
            out = {"logits": logits}
            if labels is not None:
                out["loss"] = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
            return out

    class Tokens(torch.utils.data.Dataset):
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(0)
            self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

        def __len__(self) -> int:
            return n

        def __getitem__(self, i: int):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(0)
    return TinyLM(), Tokens()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _metrics(mode: str):
    import numpy as np

    if mode == "batch":
        state = {"correct": 0, "total": 0}

        def batched(pred, compute_result):
            preds = pred.predictions.argmax(-1)
            state["correct"] += int((preds == pred.label_ids).sum())
            state["total"] += pred.label_ids.numel()
            if compute_result:
                return {"accuracy": state["correct"] / state["total"]}
            return None

        return batched, None

    def accuracy(pred):
        preds = pred.predictions if mode == "argmax" else pred.predictions.argmax(-1)
        return {"accuracy": float(np.mean(preds == pred.label_ids))}

    argmax = (lambda logits, labels: logits.argmax(-1)) if mode == "argmax" else None
    return accuracy, argmax


def child(impl: str, n: int, mode: str, repeats: int) -> dict:
    """One measurement, in this (fresh) process: the best time of ``repeats`` evaluations, and the peak."""
    import torch

    torch.set_num_threads(max(1, os.cpu_count() // 2))
    if impl == "trainwell":
        from trainwell import Trainer, TrainingArguments
    else:
        from transformers import Trainer, TrainingArguments
    model, data = _model_and_data(n)
    compute_metrics, preprocess = _metrics(mode)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_eval_batch_size=EVAL_BATCH, report_to="none",
                                 use_cpu=True, disable_tqdm=True, batch_eval_metrics=mode == "batch")
        trainer = Trainer(model=model, args=args, compute_metrics=compute_metrics,
                          preprocess_logits_for_metrics=preprocess)
        trainer.evaluate(_model_and_data(8)[1])  # warm-up: first-call costs are not what is measured
        before = _rss_bytes()
        seconds = float("inf")
        for _ in range(repeats):  # each evaluate() frees its predictions before the next one starts
            start = time.perf_counter()
            metrics = trainer.evaluate(data)
            seconds = min(seconds, time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"impl": impl, "n": n, "mode": mode, "seconds": seconds, "peak_over_start": max(0, peak - before),
            "kept": n * SEQ * VOCAB * 4, "accuracy": metrics["eval_accuracy"]}


def _measure(python: str, impl: str, n: int, mode: str, repeats: int) -> dict:
    cmd = [python, os.path.abspath(__file__), "--child", impl, "--n", str(n), "--mode", mode,
           "--repeats", str(repeats)]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} n={n} mode={mode} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _reference_python(requested: str | None) -> str | None:
    if requested:
        return requested
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def _report(rows: list[dict]) -> None:
    print(f"{'impl':<14}{'mode':<8}{'N':>6}{'time s':>10}{'ms/sample':>11}{'peak MB':>10}{'kept MB':>10}{'peak/kept':>11}")
    for r in rows:
        ratio = r["peak_over_start"] / r["kept"]
        print(f"{r['impl']:<14}{r['mode']:<8}{r['n']:>6}{r['seconds']:>10.3f}{1000 * r['seconds'] / r['n']:>11.3f}"
              f"{r['peak_over_start'] / 2**20:>10.1f}{r['kept'] / 2**20:>10.1f}{ratio:>11.2f}")
    ours = {(r["mode"], r["n"]): r for r in rows if r["impl"] == "trainwell"}
    for r in rows:
        if r["impl"] == "transformers" and (r["mode"], r["n"]) in ours:
            mine = ours[(r["mode"], r["n"])]
            print(f"transformers / trainwell time, {r['mode']} N={r['n']}: {r['seconds'] / mine['seconds']:.1f}x; "
                  f"peak memory {r['peak_over_start'] / max(mine['peak_over_start'], 1):.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[250, 500, 1000, 2000])
    parser.add_argument("--modes", nargs="+", default=["full", "argmax", "batch"], choices=["full", "argmax", "batch"])
    parser.add_argument("--reference-modes", nargs="+", default=["full"], choices=["full", "argmax", "batch"])
    parser.add_argument("--repeats", type=int, default=3, help="best time of this many evaluate() calls")
    parser.add_argument("--reference-repeats", type=int, default=1, help="the same for transformers (slow)")
    parser.add_argument("--reference-python", default=None)
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--child", choices=["trainwell", "transformers"])
    parser.add_argument("--n", type=int)
    parser.add_argument("--mode", default="full")
    cli = parser.parse_args()
    if cli.child:
        print(json.dumps(child(cli.child, cli.n, cli.mode, cli.repeats)))
        return
    rows = [_measure(sys.executable, "trainwell", n, mode, cli.repeats) for mode in cli.modes for n in cli.sizes]
    reference = None if cli.no_reference else _reference_python(cli.reference_python)
    if reference is None and not cli.no_reference:
        print("transformers is not importable here: pass --reference-python to compare.")
    if reference is not None:
        rows += [_measure(reference, "transformers", n, mode, cli.reference_repeats)
                 for mode in cli.reference_modes for n in cli.sizes]
    _report(rows)


if __name__ == "__main__":
    main()
