"""The 4.x argument names ``TrainingArguments`` still accepts, and the ``__init__`` wrapper that applies them.

Owns the alias table (``ALIASES``: renamed, removed and inert 4.x names, each with what trainwell does with it),
:func:`translate_aliases`, the did-you-mean for an unknown keyword, and :class:`AliasInitMeta`, which wraps every
dataclass-generated ``__init__`` (subclasses included). The rest of normalization is
:mod:`trainwell.args.normalize`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from trainwell.args.normalize import declared_defaults
from trainwell.utils.errors import did_you_mean


@dataclasses.dataclass(frozen=True)
class Alias:
    """One argument name transformers 4.x accepted and 5.x removed, and what trainwell does with it.

    kind: "rename" (value moves to ``new``), "flag" (a truthy value sets ``new=value``), "attribute" (stored
    as ``args.<new>``, not a field), "noop" (accepted when in ``accept``, otherwise an error), "removed"
    (an error). A value in ``inert`` (the 4.x default) changes nothing and is dropped silently, so a
    4.x ``to_dict()`` dump still loads. ``cli`` is the command-line type (``bool`` makes a flag).
    """

    old: str
    kind: str
    new: str | None = None
    value: Any = None
    inert: tuple[Any, ...] = (None,)
    accept: tuple[Any, ...] = ()
    hint: str = ""
    cli: type = str
    check: Callable[[Any], str | None] | None = None


def _check_ratio(value: Any) -> str | None:
    if isinstance(value, (int, float)) and 0 <= value < 1:
        return None
    return (
        "a warmup ratio must lie in [0, 1) (warmup_steps >= 1 counts steps); "
        "for a longer warmup pass warmup_steps=<number of steps>"
    )


_NO_TPU = "trainwell does not support TPUs."
ALIASES: tuple[Alias, ...] = (
    Alias("evaluation_strategy", "rename", "eval_strategy"),
    Alias("warmup_ratio", "rename", "warmup_steps", inert=(None, 0, 0.0), cli=float, check=_check_ratio),
    Alias("no_cuda", "rename", "use_cpu", inert=(None, False), cli=bool),
    Alias("per_gpu_train_batch_size", "rename", "per_device_train_batch_size", cli=int),
    Alias("per_gpu_eval_batch_size", "rename", "per_device_eval_batch_size", cli=int),
    Alias("push_to_hub_model_id", "rename", "hub_model_id"),
    Alias("push_to_hub_token", "rename", "hub_token", inert=(None, "<PUSH_TO_HUB_TOKEN>")),
    Alias("group_by_length", "flag", "train_sampling_strategy", "group_by_length", (None, False), cli=bool),
    Alias("include_inputs_for_metrics", "flag", "include_for_metrics", ["inputs"], (None, False), cli=bool),
    Alias("include_tokens_per_second", "flag", "include_num_input_tokens_seen", "all", (None, False), cli=bool),
    Alias("adafactor", "flag", "optim", "adafactor", (None, False), cli=bool),
    Alias("logging_dir", "attribute", "logging_dir", hint="the tensorboard integration reads args.logging_dir "
          "(transformers 5 uses the TENSORBOARD_LOGGING_DIR environment variable)"),
    Alias("overwrite_output_dir", "noop", inert=(None, False), accept=(True,), cli=bool,
          hint="it has no effect: trainwell always writes into output_dir and resumes only when asked"),
    Alias("save_safetensors", "noop", accept=(True,), cli=bool,
          hint="trainwell always writes safetensors, and never pickled weights"),
    Alias("fp16_backend", "noop", inert=(None, "auto"), accept=("amp",),
          hint="mixed precision always uses torch.amp through Accelerate"),
    Alias("half_precision_backend", "noop", inert=(None, "auto"), accept=("amp",),
          hint="mixed precision always uses torch.amp through Accelerate"),
    Alias("use_mps_device", "noop", inert=(None, False), accept=(True,), cli=bool,
          hint="the MPS device is picked automatically when available (use_cpu=True avoids it)"),
    Alias("fp16_opt_level", "removed", inert=(None, "O1"), hint="apex is gone; fp16 uses torch.amp."),
    Alias("tpu_num_cores", "removed", cli=int, hint=_NO_TPU),
    Alias("tpu_metrics_debug", "removed", inert=(None, False), cli=bool, hint=_NO_TPU),
    Alias("jit_mode_eval", "removed", inert=(None, False), cli=bool,
          hint="Compile or trace the model yourself before passing it to the Trainer."),
    Alias("use_ipex", "removed", inert=(None, False), cli=bool,
          hint="trainwell does not support Intel Extension for PyTorch; CPU bf16 works with bf16=True."),
    Alias("past_index", "removed", inert=(None, -1), cli=int,
          hint="A model that returns cached states (mems) must feed them back inside its forward."),
    Alias("use_legacy_prediction_loop", "removed", inert=(None, False), cli=bool,
          hint="evaluate()/predict() always use the current evaluation loop."),
    Alias("torchdynamo", "removed", hint="Use torch_compile_backend=<backend> instead."),
    Alias("ray_scope", "removed", inert=(None, "last"),
          hint="trainwell does not run Ray hyperparameter searches."),
    Alias("mp_parameters", "removed", inert=(None, ""),
          hint="trainwell does not support SageMaker model parallelism."),
    Alias("fsdp_min_num_params", "removed", inert=(None, 0), cli=int,
          hint='Use fsdp_config={"min_num_params": N} instead.'),
    Alias("fsdp_transformer_layer_cls_to_wrap", "removed",
          hint='Use fsdp_config={"transformer_layer_cls_to_wrap": ["MyLayer"]} instead.'),
    Alias("push_to_hub_organization", "removed", hint="Use hub_model_id='organization/model_name' instead."),
    Alias("split_batches", "removed", inert=(None, False), cli=bool,
          hint='Use accelerator_config={"split_batches": True} instead.'),
    Alias("dispatch_batches", "removed", cli=bool,
          hint='Use accelerator_config={"dispatch_batches": True} instead.'),
)
ALIASES_BY_NAME: dict[str, Alias] = {a.old: a for a in ALIASES}


def _alias_message(alias: Alias, value: Any) -> str:
    if alias.kind == "rename":
        return f"{alias.old} is deprecated, use {alias.new} instead (it was removed in transformers 5)."
    if alias.kind == "flag":
        return f"{alias.old} is deprecated, use {alias.new}={alias.value!r} instead (removed in transformers 5)."
    return f"{alias.old} is deprecated and was removed in transformers 5: {alias.hint}."


def _apply_alias(alias: Alias, value: Any, kwargs: dict[str, Any], defaults: dict[str, Any]) -> None:
    if alias.check is not None and (problem := alias.check(value)):
        raise ValueError(f"{alias.old}={value!r}: {problem}.")
    target = alias.new
    new_value = value if alias.kind == "rename" else alias.value
    current = kwargs.get(target, defaults.get(target))
    if isinstance(new_value, list):  # a list target collects: keep what the user already asked for
        new_value = list(dict.fromkeys([*(current or []), *new_value]))
    elif target in kwargs and current != defaults.get(target) and current != new_value:
        raise ValueError(
            f"{alias.old}={value!r} and {target}={current!r} disagree: pass only {target} "
            f"({alias.old} is its transformers 4 name)."
        )
    kwargs[target] = new_value


def translate_aliases(cls: type, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rewrite 4.x keyword arguments into 5.x ones for ``cls``; return (kwargs, attributes to set after).

    Warns (FutureWarning) for each alias that does something; raises ValueError for removed arguments set
    to anything but their old default. Names that are real fields of ``cls`` are left alone.
    """
    found = [name for name in kwargs if name in ALIASES_BY_NAME]
    if found:  # a subclass may declare one of these names as a real field of its own
        names = {f.name for f in dataclasses.fields(cls)}
        found = [name for name in found if name not in names]
    if not found:
        return kwargs, {}
    kwargs, attributes = dict(kwargs), {}
    defaults = declared_defaults(cls)
    for name in found:
        alias, value = ALIASES_BY_NAME[name], kwargs.pop(name)
        if value in alias.inert:
            continue
        if alias.kind == "removed":
            raise ValueError(
                f"{name}={value!r}: this argument was removed in transformers 5 and trainwell does not "
                f"accept it. {alias.hint}"
            )
        if alias.kind == "noop" and value not in alias.accept:
            raise ValueError(
                f"{name}={value!r} is not supported: {alias.hint}. Remove {name} (transformers 5 removed it; "
                f"trainwell only tolerates {' or '.join(map(repr, alias.accept))})."
            )
        if alias.kind == "attribute":
            attributes[alias.new] = value
        elif alias.kind in ("rename", "flag"):
            _apply_alias(alias, value, kwargs, defaults)
        warnings.warn(_alias_message(alias, value), FutureWarning, stacklevel=3)
    return kwargs, attributes


@functools.cache
def _keyword_names(init: Callable[..., None]) -> frozenset[str] | None:
    """The keyword arguments ``init`` takes (None when it takes ``**kwargs``)."""
    params = list(inspect.signature(init).parameters.values())[1:]  # drop self
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY)


def _check_keywords(cls: type, init: Callable[..., None], kwargs: dict[str, Any]) -> None:
    """An unknown keyword is the ``TypeError`` the dataclass would raise, plus the value and a did-you-mean."""
    known = _keyword_names(init)
    unknown = [name for name in kwargs if known is not None and name not in known]
    if not unknown:
        return
    name = unknown[0]
    hint = did_you_mean(name, sorted(known or ())) or f" See help({cls.__name__}) for the arguments it takes."
    raise TypeError(
        f"{cls.__name__}.__init__() got an unexpected keyword argument {name!r}: {name}={kwargs[name]!r} is not "
        f"a {cls.__name__} argument.{hint}"
    )


def wrap_init(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap a dataclass-generated ``__init__`` so that it accepts the 4.x names (see :func:`translate_aliases`)
    and answers an unknown keyword with a did-you-mean (see :func:`_check_keywords`)."""
    if getattr(init, "_trainwell_alias_init", False):
        return init

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs, attributes = translate_aliases(type(self), kwargs)
        _check_keywords(type(self), init, kwargs)
        init(self, *args, **kwargs)
        for name, value in attributes.items():
            setattr(self, name, value)

    __init__._trainwell_alias_init = True  # type: ignore[attr-defined]
    return __init__


class AliasInitMeta(type):
    """Metaclass that wraps every ``__init__`` the ``@dataclass`` decorator installs on the class or a subclass.

    ``@dataclass`` sets ``__init__`` with ``setattr`` after the class body ran, so intercepting that one
    assignment covers ``@dataclass class MyArgs(TrainingArguments)`` without users doing anything, and keeps
    ``inspect.signature`` (through ``functools.wraps``) showing the real field list.
    """

    def __setattr__(cls, name: str, value: Any) -> None:
        if name == "__init__" and callable(value):
            value = wrap_init(value)
        super().__setattr__(name, value)
