"""Metric dictionaries: speed metrics, conversion to plain Python numbers, printing and saving."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np


def speed_metrics(
    split: str,
    start_time: float,
    num_samples: float | None = None,
    num_steps: float | None = None,
    num_tokens: float | None = None,
) -> dict[str, float]:
    """``{split}_runtime`` (4 decimals) and per-second rates (3 decimals), named as the reference names them."""
    runtime = time.time() - start_time
    result: dict[str, float] = {f"{split}_runtime": round(runtime, 4)}
    if runtime == 0:
        return result
    if num_samples is not None:
        result[f"{split}_samples_per_second"] = round(num_samples / runtime, 3)
    if num_steps is not None:
        result[f"{split}_steps_per_second"] = round(num_steps / runtime, 3)
    if num_tokens is not None:
        result[f"{split}_tokens_per_second"] = round(num_tokens / runtime, 3)
    return result


def to_python(obj: Any) -> Any:
    """Numpy scalars/arrays and tensors to Python numbers and lists, recursively (metrics must be JSON-able)."""
    if isinstance(obj, Mapping):
        return {k: to_python(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_python(v) for v in obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.item() if obj.size == 1 else obj.tolist()
    if hasattr(obj, "detach") and hasattr(obj, "numel"):  # a torch tensor, without importing torch
        return obj.item() if obj.numel() == 1 else obj.detach().cpu().tolist()
    return obj


def denumpify_detensorize(metrics: Any) -> Any:
    """Numpy scalars and one-element tensors to Python numbers, inside lists, tuples and dicts; anything else
    (arrays included) is returned as it is. The reference's helper for ``compute_metrics`` results."""
    if isinstance(metrics, (list, tuple)):
        return type(metrics)(denumpify_detensorize(m) for m in metrics)
    if isinstance(metrics, dict):
        return type(metrics)({k: denumpify_detensorize(v) for k, v in metrics.items()})
    if isinstance(metrics, np.generic):
        return metrics.item()
    if hasattr(metrics, "detach") and hasattr(metrics, "numel") and metrics.numel() == 1:  # a torch tensor
        return metrics.item()
    return metrics


def metrics_format(metrics: dict[str, Any]) -> dict[str, Any]:
    """A copy for printing: ``*_runtime`` as ``h:mm:ss.ss``, ``*_mem_*`` in MB, ``total_flos`` in GF, floats 4 d.p."""
    out = dict(metrics)
    for key, value in out.items():
        if "_mem_" in key and isinstance(value, (int, float)):
            out[key] = f"{int(value) >> 20}MB"
        elif key.endswith("_runtime") and isinstance(value, (int, float)):
            hours, rest = divmod(value, 3600)
            minutes, seconds = divmod(rest, 60)
            out[key] = f"{int(hours)}:{int(minutes):02d}:{seconds:05.2f}"
        elif key == "total_flos" and isinstance(value, (int, float)):
            out[key] = f"{int(value) >> 30}GF"
        elif isinstance(value, float):
            out[key] = round(value, 4)
    return out


def log_metrics(split: str, metrics: dict[str, Any], print_fn: Any = print) -> None:
    """Print ``metrics`` as an aligned block under a ``***** {split} metrics *****`` header."""
    formatted = metrics_format(metrics)
    print_fn(f"***** {split} metrics *****")
    width = max((len(k) for k in formatted), default=0)
    for key in sorted(formatted):
        print_fn(f"  {key:<{width}} = {formatted[key]:>9}")


def save_metrics(output_dir: str, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
    """Write ``{split}_results.json`` (or ``all_results.json`` for split "all") and merge into ``all_results.json``.

    The files are written by name (a link of that name is replaced, never written through) and ``all_results.json``
    is read only as a regular file of ``output_dir`` (``trainwell.utils.safe_files``).
    """
    from trainwell.utils.safe_files import read_json, write_text_file

    os.makedirs(output_dir, exist_ok=True)
    name = "all_results.json" if split == "all" else f"{split}_results.json"
    write_text_file(os.path.join(output_dir, name), json.dumps(to_python(metrics), indent=4, sort_keys=True))
    if combined and split != "all":
        path = os.path.join(output_dir, "all_results.json")
        merged: Any = read_json(path, 64 << 20, root=output_dir) if os.path.lexists(path) else {}
        if not isinstance(merged, dict):
            raise ValueError(f"{path} holds a {type(merged).__name__}, not the object of metrics save_metrics writes: "
                             "move it away.")
        merged.update(to_python(metrics))
        write_text_file(path, json.dumps(merged, indent=4, sort_keys=True))


def finite_mean(values: Any, drop_non_finite: bool) -> float:
    """Mean of the per-sample losses ``values`` as the reference takes it: in their own dtype (float32: numpy's
    pairwise sum, so ``eval_loss`` equals the reference's to the last bit, not a float64 mean that differs from it in
    the last place); with ``drop_non_finite``, NaN/Inf are left out unless nothing finite remains."""
    array = np.concatenate(values) if isinstance(values, list) and values and np.ndim(values[0]) else np.asarray(values)
    if drop_non_finite:
        finite = np.isfinite(array)
        if finite.any():
            array = array[finite]
    return float(array.mean()) if array.size else float("nan")
