"""The FSDP arguments: ``fsdp`` and ``fsdp_config`` into one normalized config and Accelerate's plugin arguments.

Owns the reference's rules: ``fsdp=True`` turns FSDP on (FSDP2 unless ``fsdp_config["version"]`` says
otherwise); the legacy option strings (``"full_shard"``, ``"shard_grad_op"``, ``"offload"``, ``"auto_wrap"``, as
one space-separated string or a list) still work and become ``fsdp_config`` entries, with a warning;
``fsdp_config`` is a dict, a JSON string or a JSON file path, and its keys may carry the ``fsdp_`` prefix that
``accelerate config`` writes. The result is ``args.fsdp_config`` (defaults filled) and ``args.fsdp_plugin_args``
(the keyword arguments of ``accelerate.utils.FullyShardedDataParallelPlugin``, as the reference builds them).
Nothing here imports accelerate or torch; the plugin is built by ``trainwell.backend.engines``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from trainwell.args.kinds import check_fsdp_kind
from trainwell.outputs import enum_value
from trainwell.utils.errors import choice_error, did_you_mean

logger = logging.getLogger(__name__)

AUTO_WRAP_POLICIES: tuple[str, ...] = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
STATE_DICT_TYPES: tuple[str, ...] = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
# fsdp_config keys of the reference (the FSDP1-only ones are refused with the version check below).
CONFIG_KEYS: tuple[str, ...] = (
    "version", "reshard_after_forward", "cpu_offload", "activation_checkpointing", "cpu_ram_efficient_loading",
    "state_dict_type", "auto_wrap_policy", "transformer_layer_cls_to_wrap", "min_num_params", "xla",
    "xla_fsdp_settings", "xla_fsdp_v2", "xla_fsdp_grad_ckpt", "backward_prefetch", "forward_prefetch",
    "use_orig_params", "sync_module_states", "limit_all_gathers",
)
_FSDP1_ONLY = ("backward_prefetch", "forward_prefetch", "use_orig_params", "sync_module_states", "limit_all_gathers")
_LEGACY_OPTIONS = ("full_shard", "shard_grad_op", "offload", "auto_wrap", "hybrid_shard", "hybrid_shard_zero2",
                   "no_shard")


def normalize_fsdp(args: Any) -> None:
    """Set ``args.fsdp`` (bool), ``args.fsdp_config`` and ``args.fsdp_plugin_args`` (None when FSDP is off)."""
    args.fsdp_plugin_args = None
    check_fsdp_kind(args.fsdp)
    if args.fsdp in (None, False, "", [], ()):
        if args.fsdp_config:
            raise ValueError(
                f"fsdp_config={args.fsdp_config!r} without fsdp: the config only applies when FSDP is on. Pass "
                "fsdp=True too, or drop fsdp_config."
            )
        args.fsdp = False
        return
    config = _load_config(args.fsdp_config)
    if args.fsdp is not True and args.fsdp not in ("true", "True"):
        _apply_legacy_options(args.fsdp, config)
    args.fsdp = True
    args.fsdp_config = config
    args.fsdp_plugin_args = plugin_args(config)
    if args.activation_checkpointing and not config.get("activation_checkpointing"):
        logger.warning(
            "activation_checkpointing=True with FSDP recomputes activations outside FSDP, which costs an extra "
            "all-gather in the backward pass: prefer fsdp_config={'activation_checkpointing': True}."
        )


def _load_config(value: Any) -> dict[str, Any]:
    if value is None:
        config: dict[str, Any] = {}
    elif isinstance(value, str):
        if not os.path.isfile(value):
            raise ValueError(f"fsdp_config={value!r}: no such file. Pass a dict, a JSON object, or a JSON file path.")
        with open(value, encoding="utf-8") as fh:
            config = json.load(fh)
    else:
        config = dict(value)
    if not isinstance(config, dict):
        raise ValueError(f"fsdp_config={value!r}: the config must be a JSON object (a dict).")
    config = {k[len("fsdp_"):] if k.startswith("fsdp_") else k: v for k, v in config.items()}
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"fsdp_config has unknown key(s) {unknown}; the keys are {', '.join(CONFIG_KEYS)}."
                         + did_you_mean(unknown[0], CONFIG_KEYS))
    return config


def _apply_legacy_options(fsdp: Any, config: dict[str, Any]) -> None:
    """The reference's legacy ``fsdp`` strings, as ``fsdp_config`` entries (FSDP2 spellings)."""
    items = fsdp.split() if isinstance(fsdp, str) else [enum_value(v) for v in fsdp]
    logger.warning("fsdp=%r: option strings are deprecated (as in the reference); pass fsdp=True and put the "
                   "options in fsdp_config instead.", fsdp)
    for item in items:
        if item not in _LEGACY_OPTIONS:
            raise choice_error("fsdp", item, _LEGACY_OPTIONS)
        if item == "full_shard":
            config.setdefault("reshard_after_forward", True)
        elif item == "shard_grad_op":
            config.setdefault("reshard_after_forward", False)
        elif item == "offload":
            config.setdefault("cpu_offload", True)
        elif item != "auto_wrap":  # auto-wrapping is the default policy already
            raise ValueError(f"fsdp={item!r} is an FSDP1 sharding strategy; trainwell runs FSDP2, where the "
                             "choices are 'full_shard' (reshard_after_forward=True) and 'shard_grad_op' (False).")


def plugin_args(config: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of Accelerate's ``FullyShardedDataParallelPlugin`` for ``config`` (defaults filled)."""
    version = int(config.get("version", 2))
    if version != 2:
        raise NotImplementedError(
            f"fsdp_config['version']={version}: trainwell runs FSDP2 only (FSDP1 is deprecated in the reference "
            "too). Use version 2, the default."
        )
    if config.get("xla"):
        raise NotImplementedError("fsdp_config['xla']=True: PyTorch/XLA FSDP is not supported by trainwell.")
    fsdp1 = sorted(k for k in _FSDP1_ONLY if k in config)
    if fsdp1:
        raise ValueError(f"fsdp_config keys {fsdp1} are FSDP1 options; FSDP2 has no such setting. Remove them.")
    config.setdefault("min_num_params", 0)
    for key in ("xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt"):  # the reference fills these in too
        config.setdefault(key, False)
    if isinstance(config.get("transformer_layer_cls_to_wrap"), str):
        config["transformer_layer_cls_to_wrap"] = [config["transformer_layer_cls_to_wrap"]]
    policy = str(config.get("auto_wrap_policy", AUTO_WRAP_POLICIES[0])).upper()
    if policy not in AUTO_WRAP_POLICIES:
        raise choice_error("fsdp_config['auto_wrap_policy']", policy, AUTO_WRAP_POLICIES)
    state_dict_type = str(config.get("state_dict_type", "FULL_STATE_DICT")).upper()
    if state_dict_type not in STATE_DICT_TYPES:
        raise choice_error("fsdp_config['state_dict_type']", state_dict_type, STATE_DICT_TYPES)
    out: dict[str, Any] = {
        "fsdp_version": 2,
        "auto_wrap_policy": policy,
        "state_dict_type": state_dict_type,
        "reshard_after_forward": _flag(config, "reshard_after_forward", True),
        "cpu_ram_efficient_loading": _flag(config, "cpu_ram_efficient_loading", False),
    }
    if _flag(config, "cpu_offload", False):
        out["cpu_offload"] = True
    if "activation_checkpointing" in config:
        out["activation_checkpointing"] = _flag(config, "activation_checkpointing", False)
    if policy == "SIZE_BASED_WRAP" and config["min_num_params"] > 0:
        out["min_num_params"] = config["min_num_params"]
    if policy == "TRANSFORMER_BASED_WRAP" and config.get("transformer_layer_cls_to_wrap"):
        out["transformer_cls_names_to_wrap"] = ",".join(config["transformer_layer_cls_to_wrap"])
    return out


def _flag(config: dict[str, Any], key: str, default: bool) -> bool:
    """A boolean option that may come as a bool or as a string from a JSON or YAML file ("true", "false")."""
    value = config.get(key, default)
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"fsdp_config[{key!r}]={value!r}: pass true or false.")
        return lowered in ("true", "1", "yes")
    return bool(value)
