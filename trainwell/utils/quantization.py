"""Quantized models (bitsandbytes 4/8-bit as in the QLoRA recipe, and the other ``transformers`` quantizers): which
of them can be trained, checked before any work.

A model is read by the attributes ``transformers`` sets when it loads one quantized (``is_quantized``,
``hf_quantizer`` with its ``is_trainable`` / ``is_qat_trainable``, ``quantization_method``, ``is_loaded_in_4bit`` /
``is_loaded_in_8bit``), through a PEFT wrapper (which hands attribute reads on to its base), never by importing
``transformers``. The reference's rules (``validate_quantization_for_training``):

* quantized weights do not train: a quantized model needs trainable adapters on top (a ``PeftModel``, or adapters
  attached with ``model.add_adapter``), unless its quantizer supports quantization-aware training;
* its quantization method must support training (the quantizer's ``is_trainable``);
* a quantized model is not fine-tuned compiled. The reference refuses a model given already compiled; trainwell
  also refuses ``torch_compile=True``, which compiles it in the same way a moment later.

And trainwell's: a bitsandbytes model trains on a device the installed bitsandbytes supports
(``bitsandbytes.supported_torch_devices``: CUDA, and the CPU too in recent releases, 0.50.2 checked); elsewhere the
error names the device, the version and what to change, before the first step fails inside a bitsandbytes kernel.
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from trainwell.outputs import enum_value
from trainwell.utils.model import is_peft_model, unwrap

BITSANDBYTES = "bitsandbytes"


def quantization_method(model: nn.Module) -> str | None:
    """How ``model`` is quantized (``"bitsandbytes"``, ``"gptq"``, ...), or None when it is not."""
    inner = unwrap(model)
    method = getattr(inner, "quantization_method", None)
    if method is None:
        config = getattr(getattr(inner, "hf_quantizer", None), "quantization_config", None)
        method = getattr(config, "quant_method", None)
    if method is None and (getattr(inner, "is_loaded_in_4bit", False) or getattr(inner, "is_loaded_in_8bit", False)):
        method = BITSANDBYTES
    if method is None and getattr(inner, "is_quantized", False):
        method = "unknown"
    return None if method is None else str(enum_value(method))


def check_trainable(model: nn.Module, compiles: bool, device_type: str) -> None:
    """Refuse, before any work, a quantized ``model`` that cannot be trained as given (see the module's rules).

    ``compiles``: the run compiles the model (``torch_compile``); ``device_type``: the run's device (``"cuda"``,
    ``"cpu"``, ...). A model that is not quantized passes untouched.
    """
    method = quantization_method(model)
    if method is None:
        return
    inner = unwrap(model)
    quantizer = getattr(inner, "hf_quantizer", None)
    # quantized weights with nothing trainable attached by transformers' own PEFT integration (model.add_adapter)
    bare = bool(getattr(inner, "is_quantized", False)) and not getattr(inner, "_hf_peft_config_loaded", False)
    if bare and (compiles or hasattr(model, "_orig_mod")):
        how = "the model was given compiled (torch.compile)" if hasattr(model, "_orig_mod") else "torch_compile=True"
        raise ValueError(
            f"The model is quantized ({method}) and {how}: a quantized model cannot be fine-tuned compiled. Pass the "
            "model uncompiled and leave torch_compile=False (torch_compile_backend and torch_compile_mode unset)."
        )
    if bare and not is_peft_model(model) and not getattr(quantizer, "is_qat_trainable", False):
        raise ValueError(
            f"The model is quantized ({method}) and has no trainable adapters: quantized weights cannot be "
            "fine-tuned. Attach adapters first, e.g. model = peft.get_peft_model(model, peft.LoraConfig(...)) (the "
            "QLoRA recipe; see docs/peft.md), then pass that model to the Trainer."
        )
    if bare and not (quantizer is not None and getattr(quantizer, "is_trainable", False)):
        raise ValueError(
            f"The model is quantized with {method}, which does not support training (its quantizer's is_trainable is "
            "False). Load the model with a quantization method that does (bitsandbytes 4-bit or 8-bit, for QLoRA), "
            "or unquantized."
        )
    if method == BITSANDBYTES:
        _check_bitsandbytes_device(device_type)


def _check_bitsandbytes_device(device_type: str) -> None:
    try:
        bnb: Any = importlib.import_module(BITSANDBYTES)
    except ImportError as err:
        raise ImportError(
            "The model is quantized with bitsandbytes, which is not installed here: pip install bitsandbytes."
        ) from err
    # releases before the multi-device backends know only CUDA, and do not declare it
    supported = set(getattr(bnb, "supported_torch_devices", None) or {"cuda"})
    if device_type not in supported:
        raise RuntimeError(
            f"The model is quantized with bitsandbytes {getattr(bnb, '__version__', '?')}, which runs on "
            f"{', '.join(sorted(supported))}, and this run's device is {device_type}. Train it on a CUDA GPU, or "
            f"install a bitsandbytes release that supports {device_type} (0.50.2 trains on the CPU), or load the "
            "model unquantized."
        )
