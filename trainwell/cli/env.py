"""``trainwell env``: what is installed and which devices are seen, to paste into a bug report.

Versions are read from package metadata (``importlib.metadata``), so optional packages are never imported.
torch is imported (devices cannot be listed otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

OPTIONAL = ("numpy", "safetensors", "tqdm", "PyYAML", "datasets", "transformers", "matplotlib", "tensorboard",
            "tensorboardX", "mlflow", "wandb", "trackio", "deepspeed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _devices() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"cpu": f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}"}
    if torch.cuda.is_available():
        out["cuda"] = [f"{i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
        out["cuda version"] = torch.version.cuda
    else:
        out["cuda"] = "not available"
    mps = getattr(torch.backends, "mps", None)
    out["mps"] = "available" if mps is not None and mps.is_available() else "not available"
    return out


def collect() -> dict[str, Any]:
    """Everything ``trainwell env`` shows, as a dict."""
    from trainwell import __version__

    return {
        "trainwell": __version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "torch": _version("torch"),
        "accelerate": _version("accelerate"),
        "optional": {name: _version(name) or "not installed" for name in OPTIONAL},
        "devices": _devices(),
    }


def run(ns: argparse.Namespace) -> int:
    info = collect()
    if ns.json:
        print(json.dumps(info, indent=2))
        return 0
    rows = [(k, v) for k, v in info.items() if not isinstance(v, dict)]
    rows += [(f"  {k}", v) for k, v in info["optional"].items()]
    rows.insert(len(rows) - len(info["optional"]), ("optional packages", ""))
    rows.append(("devices", ""))
    rows += [(f"  {k}", ", ".join(v) if isinstance(v, list) else v) for k, v in info["devices"].items()]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows))
    return 0
