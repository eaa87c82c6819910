"""Model introspection: what a model's ``forward`` takes and returns, without importing ``transformers``.

Owns label-name discovery, the ``accepts_loss_kwargs`` rule, loss extraction from the output shapes the
Trainer accepts (dict, tuple/list with the loss first, dataclass with ``loss``/``logits``), and
:class:`ModelInfo`: what the Trainer reads off its model once (label names, loss conventions, the sample keys
``forward`` takes, the flops estimate). ``transformers`` models are recognised by duck typing (class names in
the MRO, ``config``, ``save_pretrained``), never by import.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """Strip DDP/compile wrappers (``.module`` / ``._orig_mod``) to reach the user's model."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def is_peft_model(model: nn.Module) -> bool:
    """True for a ``peft`` ``PeftModel`` (any task class) or ``PeftMixedModel``, by class name: peft is never
    imported here."""
    return any(cls.__name__ in ("PeftModel", "PeftMixedModel") for cls in type(unwrap(model)).__mro__)


def inspected(model: nn.Module) -> nn.Module:
    """The model whose ``forward``, class and loss conventions describe the batches: ``unwrap(model)``, and under a
    PEFT wrapper its base model (``PeftModel.forward`` takes ``*args, **kwargs`` and hands them on), as the
    reference reads them."""
    inner = unwrap(model)
    if not is_peft_model(inner):
        return inner
    get_base = getattr(inner, "get_base_model", None)
    base = get_base() if callable(get_base) else inner.base_model.model  # PeftMixedModel has no get_base_model
    return unwrap(base)


def forward_parameters(model: nn.Module) -> dict[str, inspect.Parameter]:
    """The parameters of the inspected model's ``forward`` (empty dict if the signature cannot be read)."""
    try:
        return dict(inspect.signature(inspected(model).forward).parameters)
    except (TypeError, ValueError):
        return {}


def call_forward(model: nn.Module, inputs: dict[str, Any]) -> Any:
    """``model(**inputs)``; when the batch's keys do not fit ``forward``'s arguments, a TypeError that says so.

    Python's own message ("missing 1 required positional argument") names neither the batch's keys nor the
    usual cause: dataset columns named differently from ``forward``'s arguments, and dropped by
    ``remove_unused_columns``. The signature is only checked after a failure: no cost per step.
    """
    try:
        return model(**inputs)
    except TypeError as err:
        params = forward_parameters(model)
        if not params:
            raise
        try:
            inspect.signature(inspected(model).forward).bind(**inputs)
        except TypeError as mismatch:
            names = ", ".join(n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
            raise TypeError(
                f"The batch does not fit {type(inspected(model)).__name__}.forward({names}): {mismatch}. The batch "
                f"holds {sorted(inputs)}. Name the dataset columns (or the data collator's output keys) after "
                "forward's arguments; with remove_unused_columns=True (the default), columns forward does not "
                "name are dropped before the model sees them."
            ) from err
        raise  # the batch fits the signature: the TypeError came from inside forward


def is_pretrained_model(model: nn.Module) -> bool:
    """True for a ``transformers`` ``PreTrainedModel`` (checked by class name, so transformers is never imported)."""
    return any(cls.__name__ == "PreTrainedModel" for cls in type(unwrap(model)).__mro__)


def find_label_names(model: nn.Module) -> list[str]:
    """Forward arguments that hold labels: every name containing "label", plus the QA span names."""
    params = forward_parameters(model)
    names = [name for name in params if "label" in name]
    if type(inspected(model)).__name__.endswith("ForQuestionAnswering"):
        names += [n for n in ("start_positions", "end_positions") if n in params]
    return names


def can_return_loss(model: nn.Module) -> bool:
    """True when ``forward`` has ``return_loss=True`` by default (CLIP-style models computing a loss unasked)."""
    param = forward_parameters(model).get("return_loss")
    return param is not None and param.default is True


def accepts_loss_kwargs(model: nn.Module) -> bool:
    """Whether ``num_items_in_batch`` should be passed to ``forward`` (which then normalizes the loss by it).

    An explicit ``model.accepts_loss_kwargs`` wins. Otherwise: a ``forward`` that names ``num_items_in_batch``,
    or a ``transformers`` model whose ``forward`` takes ``**kwargs`` (its loss functions read it from there).

    The reference also says yes for *any* module whose ``forward`` has ``**kwargs``; a plain module that
    averages its own loss then gets a loss that is never divided by the accumulation steps, so its logged loss
    and gradients are multiplied by them. trainwell does not guess that from ``**kwargs`` alone.
    """
    inner = inspected(model)
    explicit = getattr(inner, "accepts_loss_kwargs", None)
    if explicit is not None:
        return bool(explicit)
    params = forward_parameters(inner)
    if "num_items_in_batch" in params:
        return True
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return has_var_kw and is_pretrained_model(inner)


def loss_shifts_labels(model: nn.Module) -> bool:
    """Causal LMs predict token i+1 at position i, so the first label of each row is never a target."""
    inner = inspected(model)
    config = getattr(inner, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return False
    loss_type = getattr(inner, "loss_type", None) or ""
    if "ForCausalLM" in str(loss_type) or type(inner).__name__.endswith("ForCausalLM"):
        return True
    # transformers models without a recognised loss_type (e.g. GPT2LMHeadModel) fall back to the causal-LM loss;
    # the reference then counts unshifted labels and divides by one item too many per row.
    loss_fn = getattr(type(inner), "loss_function", None)
    if isinstance(loss_fn, property) and is_pretrained_model(inner):
        return getattr(getattr(inner, "loss_function", None), "__name__", "") == "ForCausalLMLoss"
    return False


def main_input_name(model: nn.Module) -> str:
    return getattr(inspected(model), "main_input_name", "input_ids")


def extract_loss(outputs: Any) -> torch.Tensor:
    """The loss from a model output: ``outputs["loss"]``, ``outputs.loss`` or ``outputs[0]``."""
    if isinstance(outputs, Mapping):
        if "loss" not in outputs or outputs["loss"] is None:
            raise ValueError(
                f"The model returned a dict without a 'loss' (keys: {sorted(outputs)}). Pass labels in the batch so "
                "the model computes its loss, give the Trainer a compute_loss_func, or override compute_loss."
            )
        return outputs["loss"]
    if isinstance(outputs, (tuple, list)):
        if not outputs:
            raise ValueError("The model returned an empty tuple; it must return the loss first.")
        return outputs[0]
    if dataclasses.is_dataclass(outputs) or hasattr(outputs, "loss"):
        loss = getattr(outputs, "loss", None)
        if loss is None:
            raise ValueError(
                f"The model returned a {type(outputs).__name__} whose 'loss' is None. Pass labels in the batch, "
                "give the Trainer a compute_loss_func, or override compute_loss."
            )
        return loss
    if isinstance(outputs, torch.Tensor):
        return outputs
    raise TypeError(
        f"Cannot find a loss in a model output of type {type(outputs).__name__}: return a dict with 'loss', a "
        "tuple whose first element is the loss, or a dataclass with a 'loss' field."
    )


def output_items(outputs: Any, ignore_keys: list[str] | tuple[str, ...] = ()) -> tuple[Any, ...]:
    """The non-loss outputs (the logits and friends), in order, for prediction.

    Dicts and dataclasses keep their values minus ``loss`` and ``ignore_keys`` (``None`` values dropped);
    tuples/lists are taken whole (the caller strips the loss when it was first).
    """
    if isinstance(outputs, Mapping):
        return tuple(v for k, v in outputs.items() if k not in ignore_keys and k != "loss" and v is not None)
    if dataclasses.is_dataclass(outputs) and not isinstance(outputs, type):
        values = ((f.name, getattr(outputs, f.name)) for f in dataclasses.fields(outputs))
        return tuple(v for k, v in values if k not in ignore_keys and k != "loss" and v is not None)
    if isinstance(outputs, (tuple, list)):
        return tuple(outputs)
    return (outputs,)


def num_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in unwrap(model).parameters() if p.requires_grad or not trainable_only)


def accepts_keyword(method: Any, name: str) -> bool:
    """Whether ``method`` (a bound method or function) takes the keyword ``name`` (``**kwargs`` counts).

    User overrides of ``compute_loss`` / ``training_step`` written before the reference added
    ``num_items_in_batch`` do not take it: the Trainer passes it only to those that do. Cached per function.
    """
    return _accepts(getattr(method, "__func__", method), name)


@functools.lru_cache(maxsize=256)
def _accepts(function: Any, name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: assume the modern signature
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


@dataclass
class ModelInfo:
    """What the Trainer reads off a model once: label names, loss conventions, input name, flops factor."""

    accepts_loss_kwargs: bool
    default_label_names: list[str]  #: forward arguments that hold labels (``args.label_names`` overrides them)
    can_return_loss: bool
    shifts_labels: bool  #: a causal LM: its loss ignores the first label of each row
    main_input_name: str
    counts_flops: bool  #: the model reports ``num_parameters`` (the flops estimate needs it)
    forward_parameters: dict[str, inspect.Parameter] = field(repr=False, default_factory=dict)
    flops_params: int | None = None  #: non-embedding parameters for the flops estimate (computed on first use)

    @classmethod
    def of(cls, model: nn.Module) -> ModelInfo:
        return cls(
            accepts_loss_kwargs=accepts_loss_kwargs(model),
            default_label_names=find_label_names(model),
            can_return_loss=can_return_loss(model),
            shifts_labels=loss_shifts_labels(model),
            main_input_name=main_input_name(model),
            counts_flops=callable(getattr(unwrap(model), "num_parameters", None)),
            forward_parameters=forward_parameters(model),
        )

    def signature_columns(self, label_names: list[str]) -> list[str]:
        """Sample keys the model can take (``remove_unused_columns`` keeps these): the named ``forward``
        arguments, ``label_names``, ``label`` and ``label_ids``."""
        variadic = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
        named = [name for name, p in self.forward_parameters.items() if p.kind not in variadic]
        return list(dict.fromkeys(named + list(label_names) + ["label", "label_ids"]))

    def floating_point_ops(self, model: nn.Module, inputs: Any) -> int:
        """6 × input tokens × non-embedding parameters, for models that report ``num_parameters`` (else 0).

        The estimate follows the reference (which only counts ``transformers`` models), so ``total_flos`` means
        the same in both.
        """
        if self.flops_params is None:
            counter = getattr(unwrap(model), "num_parameters", None)
            self.flops_params = 0
            if callable(counter):
                try:
                    self.flops_params = int(counter(exclude_embeddings=True))
                except TypeError:
                    self.flops_params = int(counter())
        if not self.flops_params or not isinstance(inputs, Mapping):
            return 0
        main = inputs.get(self.main_input_name)
        return 6 * main.numel() * self.flops_params if isinstance(main, torch.Tensor) else 0
