"""The state the Trainer carries between events, and the flags callbacks use to steer it.

Owns: ``TrainerState`` (what ``trainer_state.json`` holds, and what every callback reads),
``TrainerControl`` (the five flags the loop acts on) and ``ExportableState`` (the ``state()``/``from_state``
protocol by which callbacks survive a resume). Deciding *when* flags are set belongs to
``trainwell.events.flow``; acting on them belongs to the fit loop; writing checkpoints belongs to
``trainwell.checkpoint``. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainwell.utils.safe_files import read_json, write_file

logger = logging.getLogger(__name__)

#: the most bytes of a ``trainer_state.json`` read (its ``log_history`` grows with the run: ample for millions of logs)
STATE_LIMIT = 1 << 30

# Keys every trainer_state.json has carried since the first releases of the reference; anything else may be
# absent in files written by older versions and takes its default.
_REQUIRED_JSON_FIELDS = ("epoch", "global_step", "max_steps", "log_history")


class ExportableState:
    """Mixin for objects whose state is saved in ``TrainerState.stateful_callbacks`` and restored on resume.

    ``state()`` returns ``{"args": {...}, "attributes": {...}}``: ``args`` are the constructor keyword
    arguments, ``attributes`` the values that changed since construction. Both must be JSON-serializable
    (no pickle: loading a checkpoint never executes code). ``from_state`` rebuilds an instance from that dict.
    """

    def state(self) -> dict[str, Any]:
        raise NotImplementedError(
            f"{type(self).__name__} inherits ExportableState but does not implement state(); return "
            '{"args": {...constructor kwargs...}, "attributes": {...mutable fields...}}'
        )

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Any:
        """Build an instance with ``cls(**state["args"])``, then set each of ``state["attributes"]``."""
        instance = cls(**state.get("args", {}))
        for name, value in state.get("attributes", {}).items():
            setattr(instance, name, value)
        return instance


@dataclass
class TrainerControl(ExportableState):
    """The flags through which callbacks steer the training loop.

    The loop reads them after each event; ``DefaultFlowCallback`` sets them from the strategies.
    ``should_training_stop`` stays set until a new ``train()``; ``should_epoch_stop`` is cleared at each
    epoch begin; ``should_save``, ``should_evaluate`` and ``should_log`` are cleared at each step begin (and
    each after the action it asks for), so a flag set by a callback applies to the current step only.
    """

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_step(self) -> None:
        """Clear the flags that apply to one step (``CallbackHandler.on_step_begin`` does, before the callbacks)."""
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False

    def state(self) -> dict[str, Any]:
        flags = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"args": flags, "attributes": {}}


@dataclass
class TrainerState:
    """Everything about a run that callbacks read and that a checkpoint must carry to resume it.

    One "step" is one optimizer update (``gradient_accumulation_steps`` micro-batches). ``epoch`` is
    fractional during training. ``logging_steps``/``eval_steps``/``save_steps`` are absolute step counts
    (ratios in the arguments are resolved by ``compute_steps``). ``log_history`` holds every logged dict with
    its ``step``. ``best_metric``/``best_global_step``/``best_model_checkpoint`` track
    ``metric_for_best_model``. ``stateful_callbacks`` maps a class name to that callback's ``state()`` dict, or
    to a list of them when several instances of one class are attached.

    Passing a list of callbacks as ``stateful_callbacks`` records their states (as the reference does);
    a dict is taken as already recorded (loaded from JSON).
    """

    epoch: float = 0
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list[dict[str, float]] = field(default_factory=list)
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict[str, str | float | int | bool] | None = None
    stateful_callbacks: dict[str, Any] | list[Any] | None = None

    def __post_init__(self) -> None:
        if self.log_history is None:
            self.log_history = []
        if self.stateful_callbacks is None:
            self.stateful_callbacks = {}
        elif not isinstance(self.stateful_callbacks, dict):
            self.record_callback_states(self.stateful_callbacks)

    def record_callback_states(self, callbacks: Iterable[Any]) -> dict[str, Any]:
        """Rebuild ``stateful_callbacks`` from the ``ExportableState`` objects among ``callbacks``.

        The mapping is rebuilt from scratch on every call, so saving N times with two instances of a class
        stores two states, not 2N (the reference appends on each save). Other callbacks are skipped.
        Returns the new mapping.
        """
        recorded: dict[str, Any] = {}
        for callback in callbacks:
            if not isinstance(callback, ExportableState):
                continue
            name = type(callback).__name__
            if name not in recorded:
                recorded[name] = callback.state()
            elif isinstance(recorded[name], list):
                recorded[name].append(callback.state())
            else:
                recorded[name] = [recorded[name], callback.state()]
        self.stateful_callbacks = recorded
        return recorded

    def save_to_json(self, json_path: str | os.PathLike[str]) -> None:
        """Write the state as sorted, 2-space-indented JSON plus a newline (the reference's format).

        The file is written next to its final name and renamed into place, so a crash mid-write never
        leaves a truncated ``trainer_state.json``.
        """
        text = json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"
        write_file(json_path, text)  # a fresh temporary name, then a rename: never through a link

    @classmethod
    def load_from_json(cls, json_path: str | os.PathLike[str]) -> TrainerState:
        """Read a state written by ``save_to_json`` (or by the reference Trainer).

        Raises ValueError naming the file when it is not a regular file of JSON (a link, a FIFO, or larger than
        :data:`STATE_LIMIT` bytes is refused before it is read), is not a JSON object, lacks one of ``epoch``,
        ``global_step``, ``max_steps``, ``log_history``, or holds a field of the wrong kind or range
        (:func:`state_problems`). Fields added by newer versions of the reference are ignored with a warning;
        fields missing from older files take their defaults.
        """
        data = read_json(json_path, STATE_LIMIT)
        name = os.fspath(json_path)
        try:
            state = cls.from_dict(data)
        except ValueError as err:
            raise ValueError(f"{name} {err}") from None
        unknown = unknown_fields(data)
        if unknown:
            logger.warning("Ignoring unknown fields %s in %s", unknown, name)
        return state

    @classmethod
    def from_dict(cls, data: Any) -> TrainerState:
        """A state from the parsed content of a ``trainer_state.json``, checked as :meth:`load_from_json` says;
        ValueError saying what is wrong (the caller names the file). Unknown fields are left out
        (:func:`unknown_fields` names them)."""
        if not isinstance(data, dict):
            raise ValueError(f"holds a {type(data).__name__}, not a TrainerState object")
        missing = [name for name in _REQUIRED_JSON_FIELDS if name not in data]
        if missing:
            raise ValueError(f"is not a trainer state: it lacks {', '.join(missing)}; resume from a checkpoint folder "
                             "written by Trainer")
        problems = state_problems(data)
        if problems:
            raise ValueError(f"is damaged: {problems[0]}. Resume from another checkpoint (or correct the field by "
                             "hand).")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def compute_steps(self, args: Any, max_steps: int) -> None:
        """Set ``logging_steps``, ``eval_steps`` and ``save_steps`` from ``args``.

        A value below 1 is a fraction of the run: ``ceil(max_steps * ratio)``. Other values are copied
        (integral floats become ints); ``None`` keeps the current value.
        """
        for kind in ("logging", "eval", "save"):
            value = getattr(args, f"{kind}_steps", None)
            if value is None:
                continue
            if value < 1:
                value = math.ceil(max_steps * value)
            elif isinstance(value, float) and value.is_integer():
                value = int(value)
            setattr(self, f"{kind}_steps", value)

    def init_training_references(self, trainer: Any, max_steps: int, num_train_epochs: int, trial: Any) -> None:
        """Record the run's length, the process roles and the hyperparameter-search trial, if any."""
        hp_name = getattr(trainer, "hp_name", None)
        current_trial = getattr(trainer, "_trial", None)
        if hp_name is not None and current_trial is not None:
            self.trial_name = hp_name(current_trial)
        self.trial_params = None if trial is None else trial_params(trial)
        self.max_steps = max_steps
        self.num_train_epochs = num_train_epochs
        self.is_local_process_zero = bool(trainer.is_local_process_zero())
        self.is_world_process_zero = bool(trainer.is_world_process_zero())


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# field -> (is the value acceptable, what it must be); None is accepted only where the dataclass allows it
_FIELD_RULES: dict[str, tuple[Any, str]] = {
    "epoch": (lambda v: _number(v) and v >= 0, "a number >= 0"),
    "global_step": (lambda v: _whole(v) and v >= 0, "a whole number >= 0"),
    "max_steps": (lambda v: _whole(v) and v >= 0, "a whole number >= 0"),
    "logging_steps": (lambda v: _number(v) and v > 0, "a number > 0"),
    "eval_steps": (lambda v: _number(v) and v > 0, "a number > 0"),
    "save_steps": (lambda v: _number(v) and v > 0, "a number > 0"),
    "train_batch_size": (lambda v: v is None or (_whole(v) and v > 0), "a whole number > 0 or null"),
    "num_train_epochs": (lambda v: _number(v) and v >= 0, "a number >= 0"),
    "num_input_tokens_seen": (lambda v: _number(v) and v >= 0, "a number >= 0"),
    "total_flos": (lambda v: _number(v) and v >= 0, "a number >= 0"),
    "log_history": (lambda v: isinstance(v, list) and all(isinstance(e, dict) for e in v), "a list of objects"),
    "best_metric": (lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
                    "a number or null"),
    "best_global_step": (lambda v: v is None or (_whole(v) and v >= 0), "a whole number >= 0 or null"),
    "best_model_checkpoint": (lambda v: v is None or isinstance(v, str), "a path or null"),
    "is_local_process_zero": (lambda v: isinstance(v, bool), "true or false"),
    "is_world_process_zero": (lambda v: isinstance(v, bool), "true or false"),
    "is_hyper_param_search": (lambda v: isinstance(v, bool), "true or false"),
    "trial_name": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "trial_params": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "stateful_callbacks": (lambda v: v is None or isinstance(v, dict), "an object or null"),
}


def unknown_fields(data: dict[str, Any]) -> list[str]:
    """The fields of a parsed ``trainer_state.json`` that ``TrainerState`` does not have (sorted)."""
    return sorted(set(data) - {f.name for f in dataclasses.fields(TrainerState)})


def state_problems(data: dict[str, Any]) -> list[str]:
    """What is wrong with the fields of a ``trainer_state.json`` object, each as ``"field=value is not ..."``
    (an empty list when every field read on resume has its kind and range, and ``global_step`` does not pass
    ``max_steps``). Absent fields are not checked here (older files lack some)."""
    problems = []
    for name, (ok, kind) in _FIELD_RULES.items():
        if name in data and not ok(data[name]):
            shown = repr(data[name])
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            problems.append(f"{name}={shown} is not {kind}")
    if not problems and data.get("max_steps") and data.get("global_step", 0) > data["max_steps"]:
        problems.append(f"global_step={data['global_step']} is past the run's max_steps={data['max_steps']}")
    return problems


def trial_params(trial: Any) -> dict[str, Any]:
    """The hyperparameters of a search trial: a dict (ray, wandb) or an object with ``params`` (optuna)."""
    if isinstance(trial, dict):
        return dict(trial)
    params = getattr(trial, "params", None)
    if isinstance(params, dict):
        return dict(params)
    raise TypeError(
        f"Cannot read hyperparameters from a trial of type {type(trial).__name__}: pass a dict or an optuna trial"
    )
