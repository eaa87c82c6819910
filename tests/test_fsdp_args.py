"""fsdp / fsdp_config: the reference's rules for turning FSDP on and building Accelerate's plugin arguments."""

from __future__ import annotations

import json
import logging
import os

import pytest

from trainwell import TrainingArguments

CASES = [
    {"fsdp": True},
    {"fsdp": "full_shard offload auto_wrap"},
    {"fsdp": ["shard_grad_op"], "fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 100,
                                                 "cpu_ram_efficient_loading": "true"}},
    {"fsdp": True, "fsdp_config": {"transformer_layer_cls_to_wrap": "Block", "state_dict_type": "SHARDED_STATE_DICT",
                                   "activation_checkpointing": True}},
    {"fsdp": True, "fsdp_config": {"fsdp_reshard_after_forward": False, "fsdp_cpu_offload": True}},
]


@pytest.fixture
def restore_environ():
    """The reference's arguments export FSDP settings to os.environ (ACCELERATE_USE_FSDP, ...): undo that."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("kwargs", CASES, ids=lambda k: json.dumps(k)[:60])
def test_plugin_arguments_and_config_match_the_reference(tmp_path, kwargs, restore_environ):
    transformers = pytest.importorskip("transformers")
    ours = TrainingArguments(str(tmp_path), use_cpu=True, **kwargs)
    reference = transformers.TrainingArguments(str(tmp_path), use_cpu=True, **json.loads(json.dumps(kwargs)))
    assert ours.fsdp is True and reference.fsdp is True
    assert ours.fsdp_plugin_args == reference.fsdp_plugin_args
    assert ours.fsdp_config == reference.fsdp_config


def test_config_from_a_json_string_or_file(tmp_path):
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"fsdp_state_dict_type": "SHARDED_STATE_DICT"}))
    for config in (str(path), '{"state_dict_type": "SHARDED_STATE_DICT"}'):
        args = TrainingArguments(str(tmp_path), fsdp=True, fsdp_config=config)
        assert args.fsdp_plugin_args["state_dict_type"] == "SHARDED_STATE_DICT"


def test_legacy_option_strings_warn(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        args = TrainingArguments(str(tmp_path), fsdp="shard_grad_op offload")
    assert "deprecated" in caplog.text
    assert args.fsdp_plugin_args["reshard_after_forward"] is False and args.fsdp_plugin_args["cpu_offload"] is True


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"fsdp_config": {"min_num_params": 10}}, "without fsdp"),
    ({"fsdp": "hybrid_shard"}, "FSDP1 sharding strategy"),
    ({"fsdp": "ful_shard"}, "Did you mean 'full_shard'"),
    ({"fsdp": True, "fsdp_config": {"version": 1}}, "FSDP2 only"),
    ({"fsdp": True, "fsdp_config": {"reshard_after_fwd": True}}, "Did you mean 'reshard_after_forward'"),
    ({"fsdp": True, "fsdp_config": {"auto_wrap_policy": "SIZE_WRAP"}}, "auto_wrap_policy"),
    ({"fsdp": True, "fsdp_config": {"state_dict_type": "LOCAL_STATE_DICT"}}, "state_dict_type"),
    ({"fsdp": True, "fsdp_config": {"use_orig_params": True}}, "FSDP1 options"),
    ({"fsdp": True, "fsdp_config": {"cpu_offload": "maybe"}}, "pass true or false"),
    ({"fsdp": True, "fsdp_config": "missing.json"}, "no such file"),
])
def test_bad_fsdp_settings_fail_at_construction(tmp_path, kwargs, message):
    with pytest.raises((ValueError, NotImplementedError), match=message):
        TrainingArguments(str(tmp_path), **kwargs)


def test_fsdp_that_accelerate_would_not_run_is_an_error(tmp_path, restore_environ):
    """One plain process (no launcher, no GPU): Accelerate would quietly train without FSDP."""
    from tests.common.models import RegressionModel
    from trainwell import Trainer

    args = TrainingArguments(str(tmp_path), fsdp=True, use_cpu=True, report_to="none")
    with pytest.raises(RuntimeError, match=r"FSDP was asked for \(fsdp=True or accelerate launch\).*torchrun"):
        Trainer(model=RegressionModel(), args=args)


def test_an_earlier_fsdp_trainer_does_not_turn_fsdp_on_for_the_next_one(tmp_path, restore_environ):
    """Accelerate records a plugin's FSDP in os.environ for the rest of the process; the next Trainer ignores it."""
    from tests.common.models import RegressionModel
    from trainwell import Trainer

    with pytest.raises(RuntimeError):
        Trainer(model=RegressionModel(), args=TrainingArguments(str(tmp_path), fsdp=True, use_cpu=True))
    assert os.environ.get("ACCELERATE_USE_FSDP") == "true"  # what Accelerate left behind
    trainer = Trainer(model=RegressionModel(), args=TrainingArguments(str(tmp_path), use_cpu=True, report_to="none"))
    assert trainer.runtime.engine.name == "data_parallel"


def test_size_based_wrapping_that_would_pick_a_module_container_is_refused_early():
    """Accelerate's size policy would hand the ModuleList holding the layers to fully_shard, which cannot wrap a
    container: the error names it and the class-based policy that works."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch import nn
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    from trainwell.backend.fsdp import check_size_based_wrap

    class Layer(nn.Linear):
        pass

    model = nn.Sequential(nn.Linear(4, 4))
    model.layers = nn.ModuleList([Layer(16, 16), Layer(16, 16)])
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=100)
    assert getattr(plugin.auto_wrap_policy, "func", plugin.auto_wrap_policy) is size_based_auto_wrap_policy
    with pytest.raises(ValueError, match=r"would shard 'layers' \(ModuleList, 544 parameters\).*"
                                         r"'transformer_layer_cls_to_wrap': \['Layer'\].*min_num_params >= 544"):
        check_size_based_wrap(plugin, model)
    plugin.min_num_params = 544
    check_size_based_wrap(plugin, model)  # the container stays below the limit: nothing to refuse
    check_size_based_wrap(FullyShardedDataParallelPlugin(fsdp_version=2, transformer_cls_names_to_wrap=["Layer"]),
                          model)
