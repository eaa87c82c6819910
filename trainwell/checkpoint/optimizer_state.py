"""Loading a saved optimizer (and scheduler) state: laid out for this run's groups, and checked before it is loaded.

Owns :func:`align_optimizer_state`, and the checks that stand between a saved state and a kernel:
:func:`check_optimizer_state` (the structure, every tensor's shape and kind, ``step``, the entries each state needs,
the optimizer's kind) and :func:`scheduler_state_problem`. They say what is wrong; the caller names the file.

``torch.optim.Optimizer.load_state_dict`` needs the same number of groups with the same number of parameters in
each. Checkpoints do not always match trainwell's groups:

* the reference Trainer always builds two groups (weight decay / no weight decay) and keeps an empty one,
  where trainwell drops empty groups;
* with ``weight_decay=0`` trainwell puts every parameter in one group, the reference still splits them
  (decay parameters first, then the others), so the flat parameter order differs too.

The saved per-parameter states are keyed by position in the saved groups. To re-key them, the saved layout
must be recognised: either trainwell's own flat order (groups merely split or merged), or the reference's
order (the decay parameters of :func:`trainwell.optim.param_groups.get_decay_parameter_names` first, then the
rest). A layout is accepted only if every saved moment tensor has its parameter's shape, so a wrong guess
is an error naming the fix, never a silent mix-up.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


def _group_sizes(groups: list[dict[str, Any]]) -> list[int]:
    return [len(g["params"]) for g in groups]


def align_optimizer_state(
    saved: dict[str, Any], optimizer: torch.optim.Optimizer, model: nn.Module
) -> tuple[dict[str, Any], list[int] | None]:
    """``saved`` rewritten to the group layout of ``optimizer``, and for each current group the index of the
    saved group it came from (``None`` when the layout already fits and nothing was changed).

    Each current group takes the hyper-parameters (``lr``, ``weight_decay``, ``initial_lr``, ...) of the saved
    group(s) its parameters came from; merging saved groups whose hyper-parameters differ is refused, since
    one of them would be silently changed. Raises ValueError naming the group sizes when no layout fits.
    """
    problem = _structure_problem(saved)
    if problem is not None:
        raise ValueError(f"is not an optimizer state: {problem}.")
    current = optimizer.param_groups
    if _group_sizes(saved["param_groups"]) == _group_sizes(current):
        return saved, None
    kept = [i for i, g in enumerate(saved["param_groups"]) if g["params"]]
    non_empty = [saved["param_groups"][i] for i in kept]
    if _group_sizes(non_empty) == _group_sizes(current):
        logger.info("Optimizer state: dropped %d empty saved parameter group(s).",
                    len(saved["param_groups"]) - len(kept))
        return {**saved, "param_groups": non_empty}, kept
    params = [p for g in current for p in g["params"]]
    saved_count = sum(_group_sizes(saved["param_groups"]))
    if saved_count != len(params):
        raise _mismatch(saved, current, f"the checkpoint has {saved_count} parameters, the optimizer {len(params)}")
    for order in (params, _reference_order(model, params)):
        if order is not None and _shapes_fit(saved, order):
            return _regroup(saved, optimizer, order)
    raise _mismatch(saved, current, "no known parameter order matches the saved moment shapes")


def _structure_problem(saved: Any) -> str | None:
    """What keeps ``saved`` from being a ``torch.optim.Optimizer.state_dict()``: ``{"state": {index: {key: value}},
    "param_groups": [{"params": [index, ...], ...}]}``."""
    if not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        return "it needs a 'state' dictionary"
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return "its 'param_groups' is not a list of groups"
    for number, group in enumerate(groups):
        params = group.get("params")
        if not isinstance(params, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in params):
            return f"group {number}'s 'params' is not a list of parameter numbers"
    indices = [i for g in groups for i in g["params"]]
    if len(set(indices)) != len(indices):
        return "a parameter number appears in two groups"
    for index, entries in saved["state"].items():
        if not isinstance(entries, dict) or not all(isinstance(k, str) for k in entries):
            return f"the state of parameter #{index} is not a dictionary of named entries"
    return None


def _reference_order(model: nn.Module, params: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """The optimizer's parameters in the reference Trainer's order: decay ones first, then the others."""
    from trainwell.optim.param_groups import get_decay_parameter_names

    wanted = {id(p) for p in params}
    decay = set(get_decay_parameter_names(model))
    named = [(n, p) for n, p in model.named_parameters() if id(p) in wanted]
    if len(named) != len(params):
        return None
    return [p for n, p in named if n in decay] + [p for n, p in named if n not in decay]


def _shapes_fit(saved: dict[str, Any], order: list[torch.Tensor]) -> bool:
    """Every saved per-parameter tensor that is not a scalar has the shape of the parameter it maps to."""
    flat_ids = [i for g in saved["param_groups"] for i in g["params"]]
    for position, saved_id in enumerate(flat_ids):
        for value in saved["state"].get(saved_id, {}).values():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != order[position].shape:
                return False
    return True


def _regroup(
    saved: dict[str, Any], optimizer: torch.optim.Optimizer, order: list[torch.Tensor]
) -> tuple[dict[str, Any], list[int]]:
    """Build a state dict in the optimizer's own layout from ``saved`` read in ``order``."""
    flat_ids = [i for g in saved["param_groups"] for i in g["params"]]
    group_of = {i: gi for gi, g in enumerate(saved["param_groups"]) for i in g["params"]}
    by_param = {id(p): saved_id for p, saved_id in zip(order, flat_ids)}
    state: dict[int, Any] = {}
    groups: list[dict[str, Any]] = []
    group_map: list[int] = []
    index = 0
    for current in optimizer.param_groups:
        sources = [group_of[by_param[id(p)]] for p in current["params"]]
        group_map.append(sources[0] if sources else 0)
        hyper = [{k: v for k, v in saved["param_groups"][g].items() if k != "params"} for g in sources]
        if any(h != hyper[0] for h in hyper[1:]):
            raise ValueError(
                "The checkpoint's optimizer groups have different hyper-parameters "
                f"({[h for h in hyper if h != hyper[0]][0]} vs {hyper[0]}) but trainwell's optimizer puts their "
                "parameters in one group. Pass the same weight_decay as the run that wrote the checkpoint, or "
                "build matching groups with optimizer_cls_and_kwargs / create_optimizer."
            )
        ids = []
        for p in current["params"]:
            saved_id = by_param[id(p)]
            if saved_id in saved["state"]:
                state[index] = saved["state"][saved_id]
            ids.append(index)
            index += 1
        groups.append({**copy.deepcopy(hyper[0] if hyper else {}), "params": ids})
    logger.info("Optimizer state: re-grouped %s saved parameters into groups of %s.",
                _group_sizes(saved["param_groups"]), _group_sizes(groups))
    return {"state": state, "param_groups": groups}, group_map


def align_scheduler_state(saved: dict[str, Any], group_map: list[int] | None, saved_groups: int) -> dict[str, Any]:
    """Per-group lists of a scheduler state (``base_lrs``, ``_last_lr``, ...) re-ordered by ``group_map``.

    ``group_map[i]`` is the saved group the optimizer's group ``i`` came from (see
    :func:`align_optimizer_state`); lists of any other length are left alone.
    """
    if group_map is None:
        return saved
    out = dict(saved)
    for key, value in saved.items():
        if isinstance(value, list) and len(value) == saved_groups:
            out[key] = [value[i] for i in group_map]
    return out


def _mismatch(saved: dict[str, Any], current: list[dict[str, Any]], why: str) -> ValueError:
    return ValueError(f"cannot be loaded: its parameter groups have sizes {_group_sizes(saved['param_groups'])}, the "
                      f"optimizer's {_group_sizes(current)} ({why}).")


# State entries that torch's optimizers keep per parameter, in the parameter's shape (Adam, AdamW, NAdam, RAdam,
# Adamax, SGD, RMSprop, Adagrad, Adadelta, Rprop, ASGD): each must match its parameter exactly.
_PARAMETER_SHAPED = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg",
                               "grad_avg", "acc_delta", "sum", "exp_inf", "prev", "step_size", "ax"})
# Group entries that say nothing about the optimizer's kind (bookkeeping, or defaults torch fills in on load).
_BOOKKEEPING = frozenset({"params", "param_names", "initial_lr", "foreach", "maximize", "capturable",
                          "differentiable", "fused", "decoupled_weight_decay"})


# The entries each parameter's state holds in torch's optimizers, once the optimizer stepped (more with options).
_NEEDED: dict[str, tuple[str, ...]] = {"Adam": ("step", "exp_avg", "exp_avg_sq"), "AdamW": ("step", "exp_avg",
                                       "exp_avg_sq"), "Adamax": ("step", "exp_avg", "exp_inf"), "NAdam": (
                                       "step", "mu_product", "exp_avg", "exp_avg_sq"), "RAdam": ("step", "exp_avg",
                                       "exp_avg_sq"), "Adagrad": ("step", "sum"), "Adadelta": ("step", "square_avg",
                                       "acc_delta"), "RMSprop": ("step", "square_avg"), "Rprop": ("step", "prev",
                                       "step_size"), "ASGD": ("step", "eta", "mu", "ax")}


def check_optimizer_state(saved: dict[str, Any], optimizer: torch.optim.Optimizer, names: dict[int, str],
                          saved_optim: str | None = None) -> None:
    """Refuse an optimizer state (already in ``optimizer``'s group layout) that does not fit the optimizer.

    Checked before anything is loaded, so no mismatched state reaches a (fused) kernel: the groups hold this
    optimizer's hyperparameters (not another kind's: AdamW's state under SGD), every state entry belongs to a
    parameter, every per-parameter tensor has its parameter's shape (the moments of torch's optimizers, scalars
    included: a 0-dim ``exp_avg_sq`` for a matrix would overrun a fused kernel) and a floating kind where its
    parameter has one, ``step`` is one finite, whole, non-negative number, and a parameter's state holds every entry
    its optimizer reads (a missing ``exp_avg``). ``names`` maps ``id(parameter)`` to its name, for the message.
    Raises ValueError saying what differs (the caller names the file and the fix).
    """
    _check_kind(saved, optimizer, saved_optim)
    for number, (group, mine) in enumerate(zip(saved["param_groups"], optimizer.param_groups)):
        problem = next((_setting_problem(key, group[key], value) for key, value in mine.items() if key in group
                        and key not in _BOOKKEEPING and _setting_problem(key, group[key], value)), None)
        if problem is not None:
            raise ValueError(f"does not fit the optimizer: its parameter group {number} has {problem}.")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    needed = _needed_entries(optimizer)
    for index, entries in saved.get("state", {}).items():
        if not isinstance(index, int) or not 0 <= index < len(params):
            raise ValueError(f"holds a state for parameter #{index}, but the optimizer has {len(params)} parameters.")
        param = params[index]
        name = names.get(id(param), f"#{index}")
        problems = [_entry_problem(key, value, param) for key, value in (entries or {}).items()]
        lacking = [key for key in needed.get(index, ()) if entries and key not in entries]
        problems.append(f"no {lacking[0]} (which {type(optimizer).__name__} reads)" if lacking else None)
        problem = next((p for p in problems if p is not None), None)
        if problem is not None:
            raise ValueError(f"does not fit the model: the state of parameter {name} {tuple(param.shape)} "
                             f"{str(param.dtype).replace('torch.', '')} has {problem}.")


def _needed_entries(optimizer: torch.optim.Optimizer) -> dict[int, tuple[str, ...]]:
    """For each parameter (by position), the entries its state holds once the optimizer stepped."""
    needed, index = {}, 0
    for group in optimizer.param_groups:
        keys = _NEEDED.get(type(optimizer).__name__, ())
        if keys and group.get("amsgrad"):
            keys = (*keys, "max_exp_avg_sq")
        for _ in group["params"]:
            needed[index] = keys
            index += 1
    return needed


def _check_kind(saved: dict[str, Any], optimizer: torch.optim.Optimizer, saved_optim: str | None) -> None:
    saved_keys = {k for g in saved.get("param_groups", []) for k in g} - _BOOKKEEPING
    current_keys = {k for g in optimizer.param_groups for k in g} - _BOOKKEEPING
    missing, extra = sorted(current_keys - saved_keys), sorted(saved_keys - current_keys)
    state_keys = sorted({k for entries in saved.get("state", {}).values() for k in (entries or {})} - {"step"})
    if missing and extra:  # version skew adds or drops a setting; another optimizer does both
        written = f" (its run used optim={saved_optim!r})" if saved_optim else ""
        raise ValueError(
            f"was written by another kind of optimizer{written}: its state holds {state_keys or extra} and its groups "
            f"{extra}, while {type(optimizer).__name__} needs {missing}. Pass the optim of the run that wrote it."
        )


def _entry_problem(key: str, value: Any, param: torch.Tensor) -> str | None:
    if key == "step":
        return _step_problem(value)
    if not isinstance(value, torch.Tensor):
        return f"{key} of type {type(value).__name__}" if key in _PARAMETER_SHAPED and value is not None else None
    shape = tuple(value.shape)
    if key in _PARAMETER_SHAPED:
        if value.shape != param.shape:
            return f"{key} of shape {shape}"
        if param.is_floating_point() and not (value.is_floating_point() or value.is_complex()):
            return f"{key} of kind {str(value.dtype).replace('torch.', '')}"
    elif 0 < value.dim() == param.dim() and value.numel() == param.numel() and value.shape != param.shape:
        return f"{key} of shape {shape}"  # another optimizer's per-parameter state, laid out for another shape
    return None


def _setting_problem(key: str, value: Any, mine: Any) -> str | None:
    """A group's setting (``lr``, ``betas``, ``eps``...) of another kind than the optimizer's own, or not finite."""
    if isinstance(mine, torch.Tensor):
        mine = mine.item() if mine.numel() == 1 else None
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        value = value.item()
    if isinstance(mine, (int, float)) and not isinstance(mine, bool):
        return None if _finite_number(value) else f"{key}={_short(value)} where a number is kept"
    if isinstance(mine, tuple) and all(_finite_number(v) for v in mine):
        if not isinstance(value, (tuple, list)) or len(value) != len(mine) or not all(_finite_number(v) for v in value):
            return f"{key}={_short(value)} where {len(mine)} numbers are kept"
    return None


def _step_problem(value: Any) -> str | None:
    """``step``: a number, or a tensor of one real value (torch keeps it as a 0-dim float tensor), whole, finite,
    not negative."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            return f"step of shape {tuple(value.shape)} and kind {str(value.dtype).replace('torch.', '')}"
        number = value.item()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = value
    else:
        return f"step of type {type(value).__name__}"
    if not (number == number and abs(number) != float("inf")) or number < 0 or number != int(number):
        return f"step={number!r} (a count of steps: a whole number, 0 or more)"
    return None


def scheduler_state_problem(saved: Any, scheduler: Any) -> str | None:
    """What keeps ``saved`` from being loaded into ``scheduler``: not a dictionary, or an entry the scheduler has
    of another kind (a number where it keeps a number, a list of as many values where it keeps a list, each a
    finite number where its own are), ``last_epoch`` not a whole number from -1 up; None when it fits."""
    if not isinstance(saved, dict):
        return f"it holds a {type(saved).__name__}, not a scheduler's state dictionary"
    own = scheduler.state_dict()
    for key, mine in own.items():
        if key not in saved:
            continue
        value = saved[key]
        if isinstance(mine, (int, float)) and not isinstance(mine, bool):
            if not _finite_number(value) or (isinstance(mine, int) and value != int(value)):
                return f"{key}={value!r} where a {type(mine).__name__} is kept"
        elif isinstance(mine, list) and all(_finite_number(v) for v in mine):
            if not isinstance(value, list) or len(value) != len(mine) or not all(_finite_number(v) for v in value):
                return f"{key}={_short(value)} where {len(mine)} numbers are kept (one per parameter group)"
    if "last_epoch" in saved and saved["last_epoch"] < -1:
        return f"last_epoch={saved['last_epoch']!r} (a step count: -1 or more)"
    return None


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float(
        "inf")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
