"""Loading a saved optimizer state into an optimizer whose parameter groups are laid out differently.

Owns :func:`align_optimizer_state`. ``torch.optim.Optimizer.load_state_dict`` needs the same number of
groups with the same number of parameters in each. Checkpoints do not always match trainwell's groups:

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
    return ValueError(
        f"Cannot load the checkpoint's optimizer state: its parameter groups have sizes "
        f"{_group_sizes(saved['param_groups'])}, the optimizer's {_group_sizes(current)} ({why}). Resume with "
        "the same model and optimizer settings, or delete optimizer.pt to restart the optimizer from scratch."
    )


# State entries that torch's optimizers keep per parameter, in the parameter's shape (Adam, AdamW, NAdam, RAdam,
# Adamax, SGD, RMSprop, Adagrad, Adadelta, Rprop, ASGD): each must match its parameter exactly.
_PARAMETER_SHAPED = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg",
                               "grad_avg", "acc_delta", "sum", "exp_inf", "prev", "step_size", "ax"})
# Group entries that say nothing about the optimizer's kind (bookkeeping, or defaults torch fills in on load).
_BOOKKEEPING = frozenset({"params", "param_names", "initial_lr", "foreach", "maximize", "capturable",
                          "differentiable", "fused", "decoupled_weight_decay"})


def check_optimizer_state(saved: dict[str, Any], optimizer: torch.optim.Optimizer, names: dict[int, str],
                          file: str, saved_optim: str | None = None) -> None:
    """Refuse an optimizer state (already in ``optimizer``'s group layout) that does not fit the optimizer.

    Checked before anything is loaded, so no mismatched state reaches a (fused) kernel: the groups hold this
    optimizer's hyperparameters (not another kind's: AdamW's state under SGD), every state entry belongs to a
    parameter, and every per-parameter tensor has its parameter's shape (the moments of torch's optimizers) and a
    floating kind where its parameter has one. ``names`` maps ``id(parameter)`` to its name, for the message.
    Raises ValueError naming ``file``, the first parameter that differs, and the fix.
    """
    fix = f"Resume with the model and optimizer that wrote it, or delete {file} to start the optimizer from scratch."
    _check_kind(saved, optimizer, file, saved_optim, fix)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, entries in saved.get("state", {}).items():
        if not isinstance(index, int) or not 0 <= index < len(params):
            raise ValueError(f"{file} holds a state for parameter #{index}, but the optimizer has {len(params)} "
                             f"parameters. {fix}")
        param = params[index]
        name = names.get(id(param), f"#{index}")
        for key, value in (entries or {}).items():
            problem = _entry_problem(key, value, param)
            if problem is not None:
                raise ValueError(f"{file} does not fit the model: the state of parameter {name} "
                                 f"{tuple(param.shape)} {str(param.dtype).replace('torch.', '')} has {problem}. {fix}")


def _check_kind(saved: dict[str, Any], optimizer: torch.optim.Optimizer, file: str, saved_optim: str | None,
                fix: str) -> None:
    saved_keys = {k for g in saved.get("param_groups", []) for k in g} - _BOOKKEEPING
    current_keys = {k for g in optimizer.param_groups for k in g} - _BOOKKEEPING
    missing, extra = sorted(current_keys - saved_keys), sorted(saved_keys - current_keys)
    state_keys = sorted({k for entries in saved.get("state", {}).values() for k in (entries or {})} - {"step"})
    if missing and extra:  # version skew adds or drops a setting; another optimizer does both
        written = f" (its run used optim={saved_optim!r})" if saved_optim else ""
        raise ValueError(
            f"{file} was written by another kind of optimizer{written}: its state holds {state_keys or extra} and "
            f"its groups {extra}, while {type(optimizer).__name__} needs {missing}. Pass the optim of the run that "
            f"wrote the checkpoint, or delete {file} to start the new optimizer from scratch."
        )


def _entry_problem(key: str, value: Any, param: torch.Tensor) -> str | None:
    if not isinstance(value, torch.Tensor) or key == "step" or value.dim() == 0:
        return None
    shape = tuple(value.shape)
    if key in _PARAMETER_SHAPED:
        if value.shape != param.shape:
            return f"{key} of shape {shape}"
        if param.is_floating_point() and not (value.is_floating_point() or value.is_complex()):
            return f"{key} of kind {str(value.dtype).replace('torch.', '')}"
    elif value.dim() == param.dim() and value.numel() == param.numel() and value.shape != param.shape:
        return f"{key} of shape {shape}"  # another optimizer's per-parameter state, laid out for another shape
    return None
