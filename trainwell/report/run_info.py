"""What a run was trained with: the hyperparameters of its ``training_args.json`` and the recorded versions.

``training_args.json`` is what trainwell's ``save_model`` and every checkpoint write (``TrainingArguments.to_dict()``);
it is looked for in the run folder, in the folder the state file came from, then in the newest checkpoint. The
reference writes ``training_args.bin`` instead, a pickle: it is never opened (loading it could run code).
Versions are read where a run records them: a ``*_version`` key of ``training_args.json``, ``trainer_state.json``
or the model's ``config.json`` (``transformers_version``), and the "Framework versions" of the model card
(``README.md``) that ``create_model_card`` writes. Standard library only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainwell.utils.safe_files import read_bytes

ARGS_FILE = "training_args.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_CARD_VERSION = re.compile(r"^- (trainwell|Transformers|Pytorch|Accelerate) (\S+)\s*$", re.MULTILINE)


def find_args_file(run_dir: str | Path, state_path: str | Path | None = None) -> Path | None:
    """The ``training_args.json`` of a run, or None (see the module docstring for where it is looked for)."""
    run = Path(run_dir)
    candidates = [run / ARGS_FILE]
    if state_path is not None:
        candidates.append(Path(state_path).parent / ARGS_FILE)
    if run.is_dir():
        checkpoints = [(int(m.group(1)), c) for c in run.iterdir() if (m := _CHECKPOINT.match(c.name))
                       and not c.is_symlink()]  # a linked checkpoint-N may be another run's
        candidates += [c / ARGS_FILE for _, c in sorted(checkpoints, key=lambda x: x[0], reverse=True)]
    return next((c for c in candidates if c.is_file()), None)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_bytes(path, 64 << 20))  # a regular file (not a link, not a FIFO), bounded
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def hyperparameters(args: dict[str, Any]) -> dict[str, str]:
    """The hyperparameters a person compares runs by, from a ``training_args.json`` dict, as display strings
    (absent ones are left out): learning rate, batch size, accumulation, length, schedule, weight decay, seed,
    precision and optimizer."""
    out: dict[str, str] = {}
    if "learning_rate" in args:
        out["learning rate"] = f"{args['learning_rate']:g}" if isinstance(args["learning_rate"], (int, float)) \
            else str(args["learning_rate"])
    if "per_device_train_batch_size" in args:
        out["batch size per device"] = str(args["per_device_train_batch_size"])
    if "gradient_accumulation_steps" in args:
        out["gradient accumulation"] = str(args["gradient_accumulation_steps"])
    max_steps = args.get("max_steps")
    if isinstance(max_steps, int) and max_steps > 0:
        out["length"] = f"max_steps={max_steps}"
    elif "num_train_epochs" in args:
        out["length"] = f"{args['num_train_epochs']:g} epochs" if isinstance(args["num_train_epochs"], (int, float)) \
            else f"{args['num_train_epochs']} epochs"
    if "lr_scheduler_type" in args:
        out["scheduler"] = str(args["lr_scheduler_type"]) + _warmup(args)
    for key, label in (("weight_decay", "weight decay"), ("seed", "seed"), ("optim", "optimizer")):
        if key in args:
            out[label] = f"{args[key]:g}" if isinstance(args[key], float) else str(args[key])
    precision = _precision(args)
    if precision:
        out["precision"] = precision
    return out


def _warmup(args: dict[str, Any]) -> str:
    steps, ratio = args.get("warmup_steps"), args.get("warmup_ratio")
    if isinstance(steps, (int, float)) and steps > 0:
        return f", warmup {steps:g} " + ("steps" if steps >= 1 else "of the steps")
    if isinstance(ratio, (int, float)) and ratio > 0:
        return f", warmup {ratio:g} of the steps"
    return ""


def _precision(args: dict[str, Any]) -> str | None:
    if not any(k in args for k in ("bf16", "fp16", "tf32")):
        return None
    mixed = "bf16 mixed" if args.get("bf16") else "fp16 mixed" if args.get("fp16") else "fp32"
    return mixed + (", tf32 matmuls" if args.get("tf32") else "")


def versions(run_dir: str | Path, args: dict[str, Any], state: dict[str, Any]) -> dict[str, str]:
    """``package -> version`` recorded by the run (none when it recorded none: versions are never guessed from
    what is installed now, which may differ from what trained the run)."""
    found: dict[str, str] = {}
    run = Path(run_dir)
    for source in (args, state, _read_json(run / "config.json")):
        for key, value in source.items():
            if key.endswith("_version") and isinstance(value, str) and value:
                found.setdefault(key.removesuffix("_version").lstrip("_"), value)
    card = run / "README.md"
    if card.is_file():
        try:
            text = read_bytes(card, 16 << 20).decode("utf-8", errors="replace")
        except (OSError, ValueError):
            text = ""
        for name, version in _CARD_VERSION.findall(text):
            found.setdefault({"Pytorch": "torch"}.get(name, name.lower()), version)
    return found


def session_hyperparameters(run_dir: str | Path, spans: list[tuple[int, int]]) -> list[dict[str, str] | None]:
    """The hyperparameters each session of a resumed run trained with, from a checkpoint it saved (``spans``: the
    ``(first, last)`` step each trained; its newest ``checkpoint-N`` with ``first < N <= last``, for the last
    session else the run folder's file); None for a session none of whose checkpoints is left."""
    run = Path(run_dir)
    try:
        steps = sorted(int(m.group(1)) for c in run.iterdir() if (m := _CHECKPOINT.match(c.name))
                       and not c.is_symlink()) if run.is_dir() else []  # a linked checkpoint-N may be another run's
    except OSError:
        steps = []
    found: list[dict[str, str] | None] = []
    for i, (first, last) in enumerate(spans):
        files = [run / f"checkpoint-{n}" / ARGS_FILE for n in reversed(steps) if first < n <= last]
        if i == len(spans) - 1:
            files.append(run / ARGS_FILE)
        path = next((f for f in files if f.is_file()), None)
        found.append(hyperparameters(_read_json(path)) if path is not None else None)
    return found


def with_session_values(info: dict[str, str], per_session: list[dict[str, str] | None]) -> dict[str, str]:
    """``info`` where a hyperparameter changed between sessions (a resume with another learning rate, batch size
    or length) reads each session's value: ``"0.001 (session 1), 0.0005 (sessions 2-3)"``; the rest as is."""
    out = dict(info)
    for key in info:
        known = [(index, values[key]) for index, values in enumerate(per_session, 1) if values and key in values]
        if len({value for _, value in known}) < 2:
            continue
        groups: list[list[Any]] = []  # [value, first session, last session] of each run of equal values
        for index, value in known:
            if groups and groups[-1][0] == value and groups[-1][2] == index - 1:
                groups[-1][2] = index
            else:
                groups.append([value, index, index])
        out[key] = ", ".join(f"{value} (session {a})" if a == b else f"{value} (sessions {a}-{b})"
                             for value, a, b in groups)
    return out


def run_info(run_dir: str | Path, state_path: str | Path, state: dict[str, Any]) -> dict[str, str]:
    """Hyperparameters and recorded versions of a run, as display rows (empty when nothing was found)."""
    path = find_args_file(run_dir, state_path)
    args = _read_json(path) if path is not None else {}
    rows = hyperparameters(args)
    for package, version in versions(run_dir, args, state).items():
        rows[f"{package} version"] = version
    return rows
