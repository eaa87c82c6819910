"""PEFT adapters in checkpoints: which files hold them, reading them safely, and loading them into a ``PeftModel``.

A ``PeftModel``'s ``save_pretrained`` (called by ``trainwell.checkpoint.io.save_model_weights``) writes its
adapters only, as the reference's checkpoints hold them: the adapter named ``"default"`` as
``adapter_model.safetensors`` + ``adapter_config.json`` in the folder itself, every other adapter in a subfolder
of its name. The trainable modules PEFT keeps besides the adapter (``modules_to_save``) are in the same file.

Loading (resume, ``load_best_model_at_end``) reads those files here, never with unrestricted pickle (safetensors,
or ``adapter_model.bin`` through ``safe_torch_load``), and hands the tensors to peft's own
``set_peft_model_state_dict``, which copies them into the existing parameters in place (an optimizer built on
them stays valid). Which parameters train is left as the model was built. ``peft`` is imported only here, and
only for a model that is a ``PeftModel`` (so it is installed). Recognising such a model is
``trainwell.utils.model.is_peft_model``; the files' cheap integrity checks are ``trainwell.checkpoint.resume``'s.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainwell.checkpoint.io import TENSOR_LIMIT, load_safetensors, safe_torch_load
from trainwell.checkpoint.layout import ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME
from trainwell.utils import model as model_utils
from trainwell.utils.safe_files import read_bytes

logger = logging.getLogger(__name__)

DEFAULT_ADAPTER = "default"  #: peft's name for an unnamed adapter: the one saved in the folder itself


def _weights_file(folder: Path) -> Path | None:
    for name in (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME):  # peft's preference: safetensors first
        if (folder / name).is_file():
            return folder / name
    return None


def saved_adapters(checkpoint: str | os.PathLike) -> dict[str, Path]:
    """The adapters saved in ``checkpoint``, by name: ``"default"`` in the folder itself, others in subfolders."""
    folder = Path(checkpoint)
    found = {DEFAULT_ADAPTER: folder} if _weights_file(folder) is not None else {}
    if folder.is_dir():
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
            if _weights_file(sub) is not None:
                found[sub.name] = sub
    return found


def adapter_weight_files(checkpoint: str | os.PathLike) -> list[Path]:
    """Every adapter weights file of ``checkpoint`` (the folder's and its adapter subfolders')."""
    return [file for folder in saved_adapters(checkpoint).values() for file in _files_in(folder)]


def _files_in(folder: Path) -> list[Path]:
    return [folder / name for name in (ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME) if (folder / name).is_file()]


def read_adapter_weights(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of the adapter saved in ``folder``: safetensors, or ``adapter_model.bin`` loaded weights-only."""
    file = _weights_file(Path(folder))
    if file is None:
        raise FileNotFoundError(f"No adapter weights in {folder}: expected {ADAPTER_SAFE_WEIGHTS_NAME} or "
                                f"{ADAPTER_WEIGHTS_NAME}.")
    if file.name == ADAPTER_SAFE_WEIGHTS_NAME:
        # read once through the folder's descriptor (a regular file, never through a link), loaded from those bytes
        return load_safetensors(read_bytes(file, TENSOR_LIMIT, file.parent), file)
    state = safe_torch_load(file, root=file.parent)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{file} does not hold a dict of tensors (found {type(state).__name__}): it is not a peft "
                         "adapter file. Delete it, or resume from another checkpoint.")
    return state


def active_adapters(model: nn.Module) -> list[str]:
    """The names of the adapters ``model`` (a ``PeftModel``) has active."""
    model = model_utils.unwrap(model)
    names = getattr(model, "active_adapters", None)
    names = names() if callable(names) else names  # a method on some peft versions, a property on others
    if isinstance(names, str):
        names = [names]
    return list(names or [getattr(model, "active_adapter", DEFAULT_ADAPTER)])


def load_adapters(model: nn.Module, checkpoint: str | os.PathLike, strict: bool = True) -> None:
    """Load every adapter saved in ``checkpoint`` into ``model`` (a ``PeftModel``), in place.

    The active adapters must be in the checkpoint (else FileNotFoundError naming what is there). An adapter saved
    there that the model lacks is added first, from its ``adapter_config.json``, as the reference does (inactive,
    frozen). Adapter keys the file lacks raise when ``strict`` (resume) and are warned about otherwise (the best
    model at the end), as are keys the model has no place for.
    """
    model = model_utils.unwrap(model)
    saved = saved_adapters(checkpoint)
    lacking = [name for name in active_adapters(model) if name not in saved]
    if lacking:
        raise FileNotFoundError(
            f"No weights of the active adapter {', '.join(map(repr, lacking))} in {checkpoint} (it holds "
            f"{', '.join(map(repr, saved)) if saved else 'no adapter'}; peft saves the adapter 'default' as "
            f"{ADAPTER_SAFE_WEIGHTS_NAME} in the folder itself, any other in a subfolder of its name). Resume from a "
            "checkpoint of this model, or activate the adapter it holds (model.set_adapter(name))."
        )
    for name, folder in saved.items():
        if name not in model.peft_config:
            _add_adapter(model, name, folder)
        _load_one(model, name, folder, strict)


def _add_adapter(model: Any, name: str, folder: Path) -> None:
    from peft import PeftConfig

    config = PeftConfig.from_pretrained(str(folder))  # adapter_config.json: JSON only
    config.inference_mode = True
    model.add_adapter(name, config)
    logger.warning("%s holds the adapter %r, which the model did not have: added (inactive, frozen) and loaded.",
                   folder, name)


def _load_one(model: Any, name: str, folder: Path, strict: bool) -> None:
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    weights = read_adapter_weights(folder)
    # the keys the adapter's file should hold (embedding layers aside: those depend on the base's files)
    expected = set(get_peft_model_state_dict(model, adapter_name=name, save_embedding_layers=False))
    try:
        result = set_peft_model_state_dict(model, weights, adapter_name=name)
    except RuntimeError as err:  # a tensor of another shape (another r, another base)
        raise RuntimeError(f"The adapter {name!r} saved in {folder} does not fit the model: {err}") from err
    missing = sorted(expected - set(weights))
    unexpected = sorted(result.unexpected_keys)
    if not (missing or unexpected):
        return
    message = (f"The adapter {name!r} saved in {folder} does not match the model's: missing {missing}, unexpected "
               f"{unexpected}.")
    if strict and missing:
        raise RuntimeError(f"{message} Resume with the adapter configuration that wrote the checkpoint.")
    logger.warning(message)


def state_to_snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    """What ``save_async`` copies to host buffers to save ``model`` later: its state dict, and for a ``PeftModel``
    only the entries its adapters' files are made of (the frozen base stays out: no host copy of it per save).

    The entries are found by running peft's own selection (``get_peft_model_state_dict``) on the state dict and
    keeping the tensors it picked; when it computes a tensor instead of picking one, the whole state dict is kept.
    """
    state = model.state_dict()
    if not model_utils.is_peft_model(model):
        return state
    from peft import get_peft_model_state_dict

    owner = {id(tensor): key for key, tensor in state.items()}
    picked: set[str] = set()
    for name in model.peft_config:
        for tensor in get_peft_model_state_dict(model, state_dict=state, adapter_name=name).values():
            if id(tensor) not in owner:
                return state
            picked.add(owner[id(tensor)])
    return {key: tensor for key, tensor in state.items() if key in picked}
