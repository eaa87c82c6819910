"""The optimizer registry: ``optim`` name -> ``(optimizer class, kwargs)``, and :func:`create_optimizer`.

Owns :data:`OPTIMIZERS` (one small factory per ``OptimizerNames`` value), :func:`parse_optim_args`,
:func:`get_optimizer_cls_and_kwargs` and :func:`create_optimizer`. Which parameters get weight decay is decided
in :mod:`trainwell.optim.param_groups`; GaLore/APOLLO parameter selection in :mod:`trainwell.optim.lowrank`.

Only torch is imported eagerly. Optional packages (bitsandbytes, torchao, galore-torch, ...) are imported when
their optimizer is asked for; a missing one raises ImportError naming the ``optim`` value and the pip command.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from trainwell.optim.lowrank import setup_low_rank_optimizer
from trainwell.optim.param_groups import build_param_groups
from trainwell.outputs import enum_value

logger = logging.getLogger(__name__)

_TRUE, _FALSE = ("true", "1", "yes", "y", "t", "on"), ("false", "0", "no", "n", "f", "off")


def _coerce(value: str) -> bool | int | float | str:
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return value


def parse_optim_args(s: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """Parse ``optim_args`` (``"k=v,k2=v2"``) into a dict; spaces are ignored and each value becomes a bool
    (``true``/``false``, any case), an int or a float when it parses as one, else stays a str. A value may
    contain ``=`` (the first one separates key and value). Empty or None gives ``{}``.

    A mapping (what a YAML or JSON config naturally holds) is taken as already parsed; its string values are
    coerced the same way. The reference accepts only the string form.
    """
    if not s:
        return {}
    if isinstance(s, Mapping):
        return {str(key): _coerce(value) if isinstance(value, str) else value for key, value in s.items()}
    parsed: dict[str, Any] = {}
    for item in s.replace(" ", "").split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(
                f"optim_args={s!r}: {item!r} is not key=value; write e.g. optim_args='momentum=0.9,nesterov=true'"
            )
        parsed[key] = _coerce(value)
    return parsed


def _as_bool(key: str, value: Any) -> bool:
    text = str(value).lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"optim_args {key}={value!r} is not a boolean; use true or false")


@dataclass
class OptimizerContext:
    """What a factory reads: the ``optim`` name, the arguments, the model, the kwargs every optimizer gets
    (``{"lr": learning_rate}``) and the parsed ``optim_args`` (read them with :meth:`take`)."""

    optim: str
    args: Any
    model: nn.Module | None
    kwargs: dict[str, Any]
    optim_args: dict[str, Any]
    used: set[str] = field(default_factory=set)

    @property
    def adam_kwargs(self) -> dict[str, Any]:
        return {"betas": (self.args.adam_beta1, self.args.adam_beta2), "eps": self.args.adam_epsilon}

    def take(self, key: str, default: Any = None) -> Any:
        """``optim_args[key]`` (or ``default``), marking the key as consumed."""
        self.used.add(key)
        return self.optim_args.get(key, default)

    def take_bool(self, key: str, default: bool | None) -> bool | None:
        value = self.take(key, default)
        return None if value is None else _as_bool(key, value)


Factory = Callable[[OptimizerContext], tuple[Any, dict[str, Any]]]


def _require(ctx: OptimizerContext, module: str, pip: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"optim={ctx.optim!r} needs the {pip!r} package, which could not be imported ({err}). "
            f"Install it with: pip install {pip}"
        ) from err


# ---- optimizers that need nothing but torch ----------------------------------------------------------------


def _adamw_torch(ctx: OptimizerContext, fused: bool = False) -> tuple[Any, dict[str, Any]]:
    kwargs = {**ctx.kwargs, **ctx.adam_kwargs}
    if fused:
        kwargs["fused"] = True
    return torch.optim.AdamW, kwargs


def _adafactor(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    from trainwell.optim.adafactor import Adafactor

    # The Trainer drives the LR through its scheduler, so Adafactor's own step-size rules are switched off.
    return Adafactor, {**ctx.kwargs, "scale_parameter": False, "relative_step": False}


def _torch_optimizer(
    ctx: OptimizerContext, cls_name: str, floats: tuple[str, ...], bools: tuple[str, ...] = ()
) -> tuple[Any, dict[str, Any]]:
    # Only the listed optim_args reach the constructor (reference behaviour); others are reported as ignored.
    kwargs = dict(ctx.kwargs)
    kwargs.update({key: float(ctx.take(key)) for key in floats if key in ctx.optim_args})
    kwargs.update({key: ctx.take_bool(key, None) for key in bools if key in ctx.optim_args})
    return getattr(torch.optim, cls_name), kwargs


# ---- optimizers from optional packages ---------------------------------------------------------------------


def _import_attr(ctx: OptimizerContext, module: str, attr: str, pip: str) -> tuple[Any, dict[str, Any]]:
    """Class ``module.attr`` with the adam kwargs (torch_xla and torch_npu AdamW variants)."""
    return getattr(_require(ctx, module, pip), attr), {**ctx.kwargs, **ctx.adam_kwargs}


def _dtype(key: str, name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"optim_args {key}={name!r} is not a torch dtype name such as float32 or bfloat16")
    return dtype


def _anyprecision(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    cls = _require(ctx, "torchdistx.optimizers", "torchdistx").AnyPrecisionAdamW
    kwargs = {**ctx.kwargs, **ctx.adam_kwargs, "use_kahan_summation": ctx.take_bool("use_kahan_summation", False)}
    for key, default in (("momentum_dtype", "float32"), ("variance_dtype", "float32"),
                         ("compensation_buffer_dtype", "bfloat16")):  # fmt: skip
        kwargs[key] = _dtype(key, ctx.take(key, default))
    return cls, kwargs


def _torchao(ctx: OptimizerContext, cls_name: str) -> tuple[Any, dict[str, Any]]:
    _require(ctx, "torchao", "torchao")
    # torchao >= 0.11 exposes the low-bit optimizers in torchao.optim; 0.4 to 0.10 in a prototype module.
    cls = None
    for module in ("torchao.optim", "torchao.prototype.low_bit_optim"):
        try:
            cls = getattr(importlib.import_module(module), cls_name, None)
        except ImportError:
            continue
        if cls is not None:
            break
    if cls is None:
        raise ImportError(
            f"optim={ctx.optim!r} needs torchao>=0.4 ({cls_name}). Install it with: pip install -U torchao"
        )
    kwargs = {
        **ctx.kwargs,
        "block_size": int(ctx.take("block_size", 256)),
        "bf16_stochastic_round": ctx.take_bool("bf16_stochastic_round", False),
        **ctx.adam_kwargs,
    }
    return cls, kwargs


def _bnb_family_kwargs(ctx: OptimizerContext, cls_name: str) -> dict[str, Any]:
    if cls_name == "AdamW":
        return ctx.adam_kwargs
    if cls_name == "Lion":
        return {"betas": (ctx.args.adam_beta1, ctx.args.adam_beta2)}
    if cls_name == "RMSprop":  # every optim_arg goes to the constructor
        ctx.used.update(ctx.optim_args)
        return dict(ctx.optim_args)
    args = ctx.args  # AdEMAMix: a third beta and the mixing weight alpha
    kwargs: dict[str, Any] = {
        "betas": (float(ctx.take("beta1", args.adam_beta1)), float(ctx.take("beta2", args.adam_beta2)),
                  float(ctx.take("beta3", 0.9999))),
        "alpha": float(ctx.take("alpha", 5.0)),
        "eps": float(ctx.take("eps", args.adam_epsilon)),
    }  # fmt: skip
    for key in ("t_alpha", "t_beta3"):
        if key in ctx.optim_args:
            kwargs[key] = int(ctx.take(key))
    return kwargs


def _bitsandbytes(ctx: OptimizerContext, cls_name: str, bits: int, paged: bool | None) -> tuple[Any, dict[str, Any]]:
    cls = getattr(_require(ctx, "bitsandbytes.optim", "bitsandbytes"), cls_name)
    kwargs = {**ctx.kwargs, **_bnb_family_kwargs(ctx, cls_name), "optim_bits": bits}
    if paged is not None:  # bitsandbytes' RMSprop has no paged variant
        kwargs["is_paged"] = paged
    return cls, kwargs


def _galore(ctx: OptimizerContext, cls_name: str) -> tuple[Any, dict[str, Any]]:
    cls = getattr(_require(ctx, "galore_torch", "galore-torch"), cls_name)
    projection = {
        "rank": int(ctx.take("rank", 128)),
        "update_proj_gap": int(ctx.take("update_proj_gap", 200)),
        "scale": float(ctx.take("scale", 0.25)),
        "proj_type": str(ctx.take("proj_type", "std")),
    }
    kwargs = dict(ctx.kwargs)
    if cls_name == "GaLoreAdafactor":  # external LR, as for plain adafactor (layer-wise too)
        kwargs.update(scale_parameter=False, relative_step=False)
    return setup_low_rank_optimizer(ctx.args, ctx.model, ctx.optim, cls, projection, kwargs)


def _apollo(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    cls = _require(ctx, "apollo_torch", "apollo-torch").APOLLOAdamW
    projection = {
        "rank": int(ctx.take("rank", 128)),
        "proj": str(ctx.take("proj", "random")),
        "scale_type": str(ctx.take("scale_type", "channel")),
        "update_proj_gap": int(ctx.take("update_proj_gap", 200)),
        "scale": float(ctx.take("scale", 1.0)),
        "proj_type": str(ctx.take("proj_type", "std")),
        **ctx.adam_kwargs,
    }
    return setup_low_rank_optimizer(ctx.args, ctx.model, ctx.optim, cls, projection, dict(ctx.kwargs))


def _lomo(ctx: OptimizerContext, cls_name: str) -> tuple[Any, dict[str, Any]]:
    cls = getattr(_require(ctx, "lomo_optim", "lomo-optim"), cls_name)
    if ctx.model is None:
        raise ValueError(f"optim={ctx.optim!r} is built from the model itself; pass model=")
    return cls, {**ctx.kwargs, "model": ctx.model}


def _grokadamw(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    cls = _require(ctx, "grokadamw", "grokadamw").GrokAdamW
    defaults = {"alpha_init": 0.98, "lamb": 2.0, "gamma": 0.1, "grokking_signal_decay_rate": 0.1,
                "gradient_clipping": 1.0}  # fmt: skip
    return cls, {**ctx.kwargs, **{key: float(ctx.take(key, value)) for key, value in defaults.items()}}


def _schedule_free(ctx: OptimizerContext, cls_name: str, adam: bool, warmup: bool) -> tuple[Any, dict[str, Any]]:
    cls = getattr(_require(ctx, "schedulefree", "schedulefree"), cls_name, None)
    if cls is None:  # RAdamScheduleFree arrived in schedulefree 1.4
        raise ImportError(f"optim={ctx.optim!r} needs schedulefree>=1.4. Install it with: pip install -U schedulefree")
    kwargs = {**ctx.kwargs, **(ctx.adam_kwargs if adam else {}), "weight_decay": ctx.args.weight_decay}
    if warmup:
        kwargs["warmup_steps"] = ctx.args.warmup_steps
    kwargs["weight_lr_power"] = float(ctx.take("weight_lr_power", 2.0))
    kwargs["r"] = float(ctx.take("r", 0.0))
    return cls, kwargs


def _stable_adamw(ctx: OptimizerContext) -> tuple[Any, dict[str, Any]]:
    cls = _require(ctx, "optimi", "torch-optimi").StableAdamW
    max_lr = ctx.take("max_lr")
    kwargs = {
        **ctx.kwargs,
        **ctx.adam_kwargs,
        "weight_decay": ctx.args.weight_decay,
        "decouple_lr": ctx.take_bool("decouple_lr", False),
        "max_lr": None if max_lr is None else float(max_lr),
        "kahan_sum": ctx.take_bool("kahan_sum", None),
    }
    return cls, kwargs


# ---- the registry ------------------------------------------------------------------------------------------

_BNB_TABLE = {  # name: (class in bitsandbytes.optim, optim_bits, is_paged or None when not applicable)
    "adamw_bnb_8bit": ("AdamW", 8, False), "adamw_8bit": ("AdamW", 8, False),
    "paged_adamw_32bit": ("AdamW", 32, True), "paged_adamw_8bit": ("AdamW", 8, True),
    "ademamix": ("AdEMAMix", 32, False), "ademamix_8bit": ("AdEMAMix", 8, False),
    "paged_ademamix_32bit": ("AdEMAMix", 32, True), "paged_ademamix_8bit": ("AdEMAMix", 8, True),
    "lion_32bit": ("Lion", 32, False), "lion_8bit": ("Lion", 8, False),
    "paged_lion_32bit": ("Lion", 32, True), "paged_lion_8bit": ("Lion", 8, True),
    "rmsprop_bnb": ("RMSprop", 32, None), "rmsprop_bnb_8bit": ("RMSprop", 8, None),
    "rmsprop_bnb_32bit": ("RMSprop", 32, None),
}  # fmt: skip
_GALORE_TABLE = {"galore_adamw": "GaLoreAdamW", "galore_adamw_8bit": "GaLoreAdamW8bit",
                 "galore_adafactor": "GaLoreAdafactor"}  # fmt: skip
LOW_RANK_OPTIMIZERS = frozenset(
    [*_GALORE_TABLE, *(f"{name}_layerwise" for name in _GALORE_TABLE), "apollo_adamw", "apollo_adamw_layerwise"]
)

OPTIMIZERS: dict[str, Factory] = {
    "adamw_torch": _adamw_torch,
    "adamw_torch_fused": partial(_adamw_torch, fused=True),
    "adafactor": _adafactor,
    "sgd": partial(_torch_optimizer, cls_name="SGD", floats=("momentum", "dampening", "weight_decay"),
                   bools=("nesterov",)),
    "adagrad": partial(_torch_optimizer, cls_name="Adagrad", floats=("lr_decay", "weight_decay", "eps")),
    "rmsprop": partial(_torch_optimizer, cls_name="RMSprop", floats=("momentum", "alpha", "eps", "weight_decay"),
                       bools=("centered",)),
    "adamw_torch_xla": partial(_import_attr, module="torch_xla.amp.syncfree", attr="AdamW", pip="torch_xla"),
    "adamw_torch_npu_fused": partial(_import_attr, module="torch_npu.optim", attr="NpuFusedAdamW", pip="torch_npu"),
    "adamw_anyprecision": _anyprecision,
    "adamw_torch_4bit": partial(_torchao, cls_name="AdamW4bit"),
    "adamw_torch_8bit": partial(_torchao, cls_name="AdamW8bit"),
    **{name: partial(_bitsandbytes, cls_name=c, bits=b, paged=p) for name, (c, b, p) in _BNB_TABLE.items()},
    **{name: partial(_galore, cls_name=c) for name, c in _GALORE_TABLE.items()},
    **{f"{name}_layerwise": partial(_galore, cls_name=c) for name, c in _GALORE_TABLE.items()},
    "apollo_adamw": _apollo,
    "apollo_adamw_layerwise": _apollo,
    "lomo": partial(_lomo, cls_name="Lomo"),
    "adalomo": partial(_lomo, cls_name="AdaLomo"),
    "grokadamw": _grokadamw,
    "schedule_free_radam": partial(_schedule_free, cls_name="RAdamScheduleFree", adam=True, warmup=False),
    "schedule_free_adamw": partial(_schedule_free, cls_name="AdamWScheduleFree", adam=True, warmup=True),
    "schedule_free_sgd": partial(_schedule_free, cls_name="SGDScheduleFree", adam=False, warmup=True),
    "stable_adamw": _stable_adamw,
}  # fmt: skip


def _optim_name(optim: Any) -> str:
    name = str(enum_value(optim))
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optim {name!r}: choose one of {', '.join(sorted(OPTIMIZERS))}")
    return name


def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[Any, dict[str, Any]]:
    """The optimizer class (or factory) and constructor kwargs that ``args.optim`` names.

    Reads ``optim`` (an ``OptimizerNames`` or its str value), ``optim_args``, ``learning_rate``,
    ``adam_beta1``, ``adam_beta2``, ``adam_epsilon``, ``weight_decay`` and ``optim_target_modules`` (plus
    ``warmup_steps``, ``gradient_accumulation_steps``, ``parallel_mode`` for the optimizers that use them).
    ``model`` is needed by GaLore, APOLLO and LOMO. The kwargs may hold ``params``, ``model`` or
    ``optimizer_dict``, which :func:`create_optimizer` passes instead of the weight-decay groups.

    Raises ValueError for an unknown name or for ``optim_target_modules`` with an optimizer that ignores it,
    and ImportError (naming the ``pip install``) when the optimizer's package is missing. ``optim_args`` keys
    the optimizer does not read are logged as ignored.
    """
    optim = _optim_name(args.optim)
    targets = getattr(args, "optim_target_modules", None)
    if targets is not None and optim not in LOW_RANK_OPTIMIZERS:
        raise ValueError(
            f"optim_target_modules={targets!r} is only used by the GaLore and APOLLO optimizers, not by "
            f"optim={optim!r}: unset optim_target_modules or choose one of {', '.join(sorted(LOW_RANK_OPTIMIZERS))}"
        )
    optim_args = parse_optim_args(getattr(args, "optim_args", None))
    ctx = OptimizerContext(optim, args, model, {"lr": args.learning_rate}, optim_args)
    cls, kwargs = OPTIMIZERS[optim](ctx)
    ignored = sorted(set(ctx.optim_args) - ctx.used)
    if ignored:
        logger.warning("optim=%r ignores optim_args %s", optim, ignored)
    return cls, kwargs


def _is_factory(cls: Any) -> bool:
    return not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer))


def create_optimizer(
    model: nn.Module, args: Any, optimizer_cls_and_kwargs: tuple[Any, dict[str, Any]] | None = None,
    decay_names: list[str] | None = None,
) -> torch.optim.Optimizer:
    """Build the optimizer for ``model``: weight-decay param groups (see
    :func:`~trainwell.optim.param_groups.build_param_groups`) handed to ``cls(groups, **kwargs)``.

    ``(cls, kwargs)`` is ``optimizer_cls_and_kwargs`` when given (the Trainer argument of that name), else
    :func:`get_optimizer_cls_and_kwargs`. A ``cls`` that is not an Optimizer subclass is a factory, called as
    ``cls()(model, **kwargs)``. ``params`` / ``model`` / ``optimizer_dict`` in kwargs replace the groups (in that
    order of precedence, last wins). ``decay_names``: the parameters that get weight decay (see
    :func:`~trainwell.optim.param_groups.build_param_groups`). The caller's kwargs dict is not modified. With 8-bit
    bitsandbytes optimizers, ``nn.Embedding`` weights are kept in 32-bit optimizer state.
    """
    cls, kwargs = optimizer_cls_and_kwargs or get_optimizer_cls_and_kwargs(args, model)
    kwargs = dict(kwargs)
    if _is_factory(cls):
        return cls()(model, **kwargs)
    target: Any = None
    for key in ("params", "model", "optimizer_dict"):
        if key in kwargs:
            target = kwargs.pop(key)
    if target is None:
        target = build_param_groups(model, args.weight_decay, decay_names)
        if not target:
            raise ValueError("the model has no parameter with requires_grad=True: there is nothing to optimize")
    optimizer = cls(target, **kwargs)
    if getattr(cls, "__module__", "").startswith("bitsandbytes") and kwargs.get("optim_bits") == 8:
        _keep_embeddings_32bit(model)
    return optimizer


def _keep_embeddings_32bit(model: nn.Module) -> None:
    # 8-bit state for embeddings is known to destabilise training; it costs 4x the state memory on them only.
    import bitsandbytes

    manager = bitsandbytes.optim.GlobalOptimManager.get_instance()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            manager.register_module_override(module, "weight", {"optim_bits": 32})
