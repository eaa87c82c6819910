"""Which parameters get weight decay, and the optimizer parameter groups built from that split.

Owns: :func:`get_parameter_names`, :func:`get_decay_parameter_names`, :func:`build_param_groups`, and reading
the groups back (:func:`learning_rates`, :func:`group_of`: the Trainer's ``get_learning_rates`` and
``get_optimizer_group``).
Which optimizer class consumes the groups is decided in :mod:`trainwell.optim.registry`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from torch import nn

# Parameter names (lower-cased) that never get weight decay: biases and anything that looks like a norm layer,
# e.g. "bias", "ln.layernorm.weight", "model.norm.weight", "post_attention_rmsnorm.weight", "q_norm.weight".
NO_DECAY_NAME_PATTERNS: tuple[str, ...] = (
    r"bias",
    r"layernorm",
    r"rmsnorm",
    r"(?:^|\.)norm(?:$|\.)",
    r"_norm(?:$|\.)",
)

# Parameters inside these module types never get weight decay, whatever they are called.
NO_DECAY_MODULE_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.RMSNorm)


def get_parameter_names(
    model: nn.Module,
    forbidden_layer_types: Iterable[type],
    forbidden_layer_names: Sequence[str] | None = None,
) -> list[str]:
    """Names of ``model``'s parameters that are not inside a forbidden module type and whose name does not
    match a forbidden pattern, in the reference's order: each module's children first (depth first, in
    ``named_children()`` order), then the module's own parameters.

    ``forbidden_layer_types``: parameters of any *submodule* that is an instance of one of these are left out
    (the root module itself is never checked). ``forbidden_layer_names``: regular expressions searched (not
    full-matched) in the lower-cased dotted name, as seen from every enclosing module, so ``"^norm"`` excludes
    ``"encoder.norm.weight"`` too. A module registered under two names is walked once, under the first (as
    ``named_children()`` does). Unlike the reference, parameters registered as ``None`` (the ``bias`` of
    ``nn.Linear(bias=False)``) are skipped: every name listed is one ``named_parameters()`` can yield.
    """
    types = tuple(forbidden_layer_types)
    patterns = [re.compile(p) for p in forbidden_layer_names or ()]

    def allowed(name: str) -> bool:
        return not any(p.search(name.lower()) for p in patterns)

    def walk(module: nn.Module) -> list[str]:
        names = []
        for child_name, child in module.named_children():
            if types and isinstance(child, types):
                continue
            # Re-checking the patterns at every level reproduces the reference's semantics exactly.
            names += [full for n in walk(child) if allowed(full := f"{child_name}.{n}")]
        return names + [k for k, p in module._parameters.items() if p is not None and allowed(k)]

    return walk(model)


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters that weight decay applies to: everything except parameters inside
    ``nn.LayerNorm`` / ``nn.RMSNorm`` modules and parameters whose name matches :data:`NO_DECAY_NAME_PATTERNS`
    (biases and norm-like names)."""
    return get_parameter_names(model, NO_DECAY_MODULE_TYPES, NO_DECAY_NAME_PATTERNS)


def build_param_groups(model: nn.Module, weight_decay: float,
                       decay_names: list[str] | None = None) -> list[dict[str, Any]]:
    """The optimizer parameter groups for ``model``.

    Group 0 holds the trainable parameters in ``decay_names`` (default :func:`get_decay_parameter_names`: a
    Trainer passes its own method's, which a subclass may override) with ``weight_decay``; group 1
    holds the other trainable parameters with ``weight_decay=0.0``. Only ``requires_grad`` parameters are
    included, in ``named_parameters()`` order. Both groups are always there, even empty or with
    ``weight_decay=0``: that is the reference's layout, so an ``optimizer.pt`` written by either Trainer loads
    into the other. When parameters live on different DTensor device meshes, each group is further split by
    mesh (fused and foreach kernels cannot span meshes).
    """
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        return []  # nothing to optimize: the optimizer's own "empty parameter list" error says so
    decay = set(get_decay_parameter_names(model) if decay_names is None else decay_names)
    groups = [
        {"params": [p for n, p in trainable if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in trainable if n not in decay], "weight_decay": 0.0},
    ]
    return _split_by_device_mesh(groups)


def _split_by_device_mesh(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Plain tensors have no ``device_mesh``; only DTensors (FSDP2, expert or tensor parallelism) do, so the
    # common case is one attribute lookup per parameter and no import of torch.distributed.
    meshes = {getattr(p, "device_mesh", None) for g in groups for p in g["params"]}
    if len(meshes) <= 1:
        return groups
    split: list[dict[str, Any]] = []
    for group in groups:
        by_mesh: dict[Any, list[nn.Parameter]] = {}
        for p in group["params"]:
            by_mesh.setdefault(getattr(p, "device_mesh", None), []).append(p)
        split.extend({**group, "params": params} for params in by_mesh.values())
    return split


def _created(optimizer: Any) -> Any:
    if optimizer is None:
        raise ValueError("The optimizer is not created yet: call create_optimizer() or train() first.")
    return optimizer


def learning_rates(optimizer: Any) -> list[float]:
    """The learning rate of each of ``optimizer``'s groups (a ValueError naming the fix while it is None)."""
    return [group["lr"] for group in _created(optimizer).param_groups]


def group_of(optimizer: Any, param: nn.Parameter | None = None) -> Any:
    """The group of ``optimizer`` that holds ``param`` (None if none does); without ``param``, every group's
    parameter list. A ValueError naming the fix while ``optimizer`` is None."""
    groups = _created(optimizer).param_groups
    if param is None:
        return [group["params"] for group in groups]
    return next((group for group in groups if any(p is param for p in group["params"])), None)
