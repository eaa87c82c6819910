"""TrainingArguments' checks: validation, the 4.x aliases and removed arguments, and the fields trainwell
does not act on yet (each refused by name when set)."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest

from tests.common.args_testing import EXPECTED_FIELDS, TRAINWELL_FIELDS, make
from trainwell.args import aliases, support
from trainwell.outputs import (
    IntervalStrategy,
    OptimizerNames,
)
from trainwell.training_args import TrainingArguments

pytestmark = pytest.mark.usefixtures("clean_launcher_env")

# --- validation -----------------------------------------------------------------------------------------------------

_STEPS_EVAL = {"eval_strategy": "steps", "save_strategy": "steps", "load_best_model_at_end": True}


@pytest.mark.parametrize(
    "kwargs, parts",
    [
        ({"torch_empty_cache_steps": 0}, ["torch_empty_cache_steps=0", "positive integer"]),
        ({"torch_empty_cache_steps": 1.5}, ["torch_empty_cache_steps=1.5"]),
        ({"logging_steps": 0}, ["logging_steps=0", "logging_strategy='no'"]),
        ({"logging_steps": 2.5}, ["logging_steps=2.5", "logging_steps=2"]),
        ({"eval_strategy": "steps", "eval_steps": 10.5}, ["eval_steps=10.5", "must be whole"]),
        ({"eval_strategy": "steps", "eval_steps": -5}, ["eval_steps=-5", "eval_strategy='no'"]),
        ({"eval_strategy": "steps", "logging_steps": 0, "logging_strategy": "no"}, ["eval_steps=None"]),
        ({"save_steps": 12.5}, ["save_steps=12.5"]),
        ({"save_steps": 0}, ["save_steps=0: pass a positive integer", "or save_strategy='no'"]),
        ({"load_best_model_at_end": True, "eval_strategy": "epoch"},
         ["load_best_model_at_end=True", "eval_strategy='epoch'", "save_strategy='steps'", "save_strategy='best'"]),
        ({**_STEPS_EVAL, "save_steps": 250, "eval_steps": 100},
         ["save_steps=250 is not a multiple of eval_steps=100", "save_steps=200 or 300"]),
        ({**_STEPS_EVAL, "save_steps": 50, "eval_steps": 100}, ["save_steps=50", "save_steps=100"]),
        ({**_STEPS_EVAL, "save_steps": 0.5, "eval_steps": 10}, ["save_steps=0.5 with eval_steps=10", "ratio"]),
        ({**_STEPS_EVAL, "save_steps": 0.25, "eval_steps": 0.1}, ["save_steps=0.25 is not a multiple"]),
        ({"fp16": True, "bf16": True}, ["fp16=True and bf16=True"]),
        ({"fp16_full_eval": True, "bf16_full_eval": True}, ["fp16_full_eval=True and bf16_full_eval=True"]),
        ({"lr_scheduler_type": "reduce_lr_on_plateau"}, ["lr_scheduler_type='reduce_lr_on_plateau'", "eval_strategy"]),
        ({"lr_scheduler_type": "greedy"}, ["lr_scheduler_type='greedy'", "eval_strategy='no'"]),
        ({"warmup_steps": -1}, ["warmup_steps=-1", "ratio"]),
        ({"warmup_steps": 2.5}, ["warmup_steps=2.5", "warmup_steps=2"]),
        ({"dataloader_prefetch_factor": 2}, ["dataloader_prefetch_factor=2", "dataloader_num_workers > 0"]),
        ({"per_device_train_batch_size": 0}, ["per_device_train_batch_size=0", "positive integer"]),
        ({"per_device_eval_batch_size": -1}, ["per_device_eval_batch_size=-1"]),
        ({"gradient_accumulation_steps": 0}, ["gradient_accumulation_steps=0", ">= 1"]),
        ({"learning_rate": -1e-3}, ["learning_rate=-0.001"]),
        ({"num_train_epochs": -1}, ["num_train_epochs=-1", "max_steps"]),
        ({"dataloader_num_workers": -2}, ["dataloader_num_workers=-2"]),
        ({"log_level": "loud"}, ["log_level='loud'", "'warning'"]),
        ({"train_sampling_strategy": "sequental"},
         ["train_sampling_strategy='sequental'", "Did you mean 'sequential'"]),
        ({"ddp_backend": "ncl"}, ["ddp_backend='ncl'", "Did you mean 'nccl'"]),
        ({"include_for_metrics": ["input"]}, ["include_for_metrics='input'", "Did you mean 'inputs'"]),
        ({"eval_accumulation_steps": 0}, ["eval_accumulation_steps=0", "positive number"]),
        ({"dataloader_persistent_workers": True}, ["dataloader_persistent_workers=True", "num_workers > 0"]),
        ({"optim_args": ["momentum=0.9"]}, ["optim_args=['momentum=0.9']", "'key=value,key2=value2'"]),
        ({"optim_args": {"betas": [0.9, 0.99]}}, ["optim_args['betas']=[0.9, 0.99]", "number, a bool"]),
        ({"report_to": ["none", "jsonl"]}, ["report_to=['none', 'jsonl']", "'none' alone"]),
    ],
)
def test_validation_errors_name_argument_value_and_fix(kwargs, parts):
    with pytest.raises(ValueError) as err:
        make(**kwargs)
    for part in parts:
        assert part in str(err.value), (part, str(err.value))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "best"},
        {**_STEPS_EVAL, "save_steps": 200, "eval_steps": 100},
        {**_STEPS_EVAL, "save_steps": 0.2, "eval_steps": 0.1},
        {"bf16": True},
        {"fp16": True},
        {"bf16": True, "fp16_full_eval": True},
        {"warmup_steps": 0.25},
        {"lr_scheduler_type": "reduce_lr_on_plateau", "eval_strategy": "epoch"},
        {"dataloader_prefetch_factor": 2, "dataloader_num_workers": 1},
        {"eval_strategy": "epoch", "logging_steps": 0, "logging_strategy": "no"},
        {"save_strategy": "no", "save_steps": 0},
        {"max_steps": 10, "num_train_epochs": 0},
    ],
)
def test_valid_combinations_pass(kwargs):
    make(**kwargs)


def test_integral_float_intervals_become_ints():
    args = make(logging_steps=10.0, save_steps=20.0, eval_strategy="steps", eval_steps=5.0)
    assert (args.logging_steps, args.save_steps, args.eval_steps) == (10, 20, 5)
    assert all(type(v) is int for v in (args.logging_steps, args.save_steps, args.eval_steps))
    assert make(logging_steps=0.5).logging_steps == 0.5


# --- 4.x aliases ------------------------------------------------------------------------------------------------------

# (kwargs, expected attributes, warning text or None, needs the support check disabled)
MAPPED_ALIASES = [
    ({"evaluation_strategy": "epoch"}, {"eval_strategy": IntervalStrategy.EPOCH, "do_eval": True},
     "evaluation_strategy is deprecated, use eval_strategy", False),
    ({"warmup_ratio": 0.1}, {"warmup_steps": 0.1}, "warmup_ratio is deprecated, use warmup_steps", False),
    ({"group_by_length": True}, {"train_sampling_strategy": "group_by_length"},
     "group_by_length is deprecated, use train_sampling_strategy='group_by_length'", True),
    ({"overwrite_output_dir": True}, {"output_dir": "trainer_output"}, "no effect", False),
    ({"logging_dir": "runs/a"}, {"logging_dir": "runs/a"}, "logging_dir is deprecated", False),
    ({"no_cuda": True}, {"use_cpu": True, "dataloader_pin_memory": False}, "no_cuda is deprecated, use use_cpu", False),
    ({"per_gpu_train_batch_size": 4}, {"per_device_train_batch_size": 4},
     "per_gpu_train_batch_size is deprecated, use per_device_train_batch_size", False),
    ({"per_gpu_eval_batch_size": 3}, {"per_device_eval_batch_size": 3},
     "per_gpu_eval_batch_size is deprecated, use per_device_eval_batch_size", False),
    ({"save_safetensors": True}, {}, "always writes safetensors", False),
    ({"include_inputs_for_metrics": True}, {"include_for_metrics": ["inputs"]},
     "include_inputs_for_metrics is deprecated, use include_for_metrics", True),
    ({"include_inputs_for_metrics": True, "include_for_metrics": ["loss"]}, {"include_for_metrics": ["loss", "inputs"]},
     "include_inputs_for_metrics is deprecated", True),
    ({"include_tokens_per_second": True}, {"include_num_input_tokens_seen": "all"},
     "include_tokens_per_second is deprecated, use include_num_input_tokens_seen='all'", False),
    ({"adafactor": True}, {"optim": OptimizerNames.ADAFACTOR}, "adafactor is deprecated, use optim='adafactor'", False),
    ({"push_to_hub_model_id": "me/model"}, {"hub_model_id": "me/model"},
     "push_to_hub_model_id is deprecated, use hub_model_id", True),
    ({"push_to_hub_token": "hf_abc"}, {"hub_token": "hf_abc"}, "push_to_hub_token is deprecated, use hub_token", True),
    ({"fp16_backend": "amp"}, {}, "fp16_backend is deprecated", False),
    ({"half_precision_backend": "amp"}, {}, "half_precision_backend is deprecated", False),
    ({"use_mps_device": True}, {}, "MPS device is picked automatically", False),
]


@pytest.mark.parametrize("kwargs, expected, warning, needs_bypass", MAPPED_ALIASES)
def test_alias_is_mapped_with_a_future_warning(kwargs, expected, warning, needs_bypass, monkeypatch):
    if needs_bypass:
        monkeypatch.setattr(support, "check_supported", lambda args, defaults: None)
    with pytest.warns(FutureWarning, match=warning):
        args = make(**kwargs)
    for name, value in expected.items():
        assert getattr(args, name) == value, name
    assert len(dataclasses.fields(args)) == 114 + len(TRAINWELL_FIELDS)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"overwrite_output_dir": False},
        {"warmup_ratio": 0.0},
        {"no_cuda": False},
        {"group_by_length": False},
        {"fp16_backend": "auto"},
        {"half_precision_backend": "auto"},
        {"past_index": -1},
        {"ray_scope": "last"},
        {"jit_mode_eval": False},
        {"evaluation_strategy": None},
        {"push_to_hub_token": "<PUSH_TO_HUB_TOKEN>"},
    ],
)
def test_alias_at_its_4x_default_is_dropped_silently(kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args = make(**kwargs)
    assert args == make()


def test_alias_targets_and_batch_rebalance_are_accepted():
    with pytest.warns(FutureWarning):
        assert make(group_by_length=True).train_sampling_strategy == "group_by_length"
    assert make(train_sampling_strategy="batch_rebalance").train_sampling_strategy == "batch_rebalance"


@pytest.mark.parametrize(
    "kwargs, parts",
    [
        ({"save_safetensors": False}, ["save_safetensors=False", "always writes safetensors"]),
        ({"fp16_backend": "apex"}, ["fp16_backend='apex'", "torch.amp"]),
        ({"half_precision_backend": "cpu_amp"}, ["half_precision_backend='cpu_amp'"]),
        ({"warmup_ratio": 1.0}, ["warmup_ratio=1.0", "warmup_steps=<number of steps>"]),
        ({"evaluation_strategy": "epoch", "eval_strategy": "steps"}, ["evaluation_strategy='epoch'", "disagree"]),
    ],
)
def test_alias_errors(kwargs, parts):
    with pytest.raises(ValueError) as err:
        make(**kwargs)
    for part in parts:
        assert part in str(err.value)


REMOVED = [
    ("tpu_num_cores", 8, "TPU"),
    ("jit_mode_eval", True, "Compile or trace"),
    ("use_ipex", True, "Intel Extension"),
    ("past_index", 0, "mems"),
    ("use_legacy_prediction_loop", True, "evaluation loop"),
    ("torchdynamo", "inductor", "torch_compile_backend"),
    ("ray_scope", "all", "Ray"),
    ("mp_parameters", "--x", "SageMaker"),
    ("tpu_metrics_debug", True, "TPU"),
    ("fsdp_min_num_params", 1000, "fsdp_config"),
    ("fsdp_transformer_layer_cls_to_wrap", "Block", "fsdp_config"),
    ("push_to_hub_organization", "org", "hub_model_id"),
    ("fp16_opt_level", "O2", "torch.amp"),
    ("split_batches", True, "accelerator_config"),
    ("dispatch_batches", True, "accelerator_config"),
]


@pytest.mark.parametrize("name, value, hint", REMOVED)
def test_removed_4x_argument_raises_with_replacement(name, value, hint):
    with pytest.raises(ValueError) as err:
        make(**{name: value})
    message = str(err.value)
    assert message.startswith(f"{name}={value!r}") and "removed in transformers 5" in message and hint in message


def test_every_alias_in_the_table_is_tested():
    tested = {name for kwargs, *_ in MAPPED_ALIASES for name in kwargs} | {name for name, *_ in REMOVED}
    assert set(aliases.ALIASES_BY_NAME) <= tested


def test_same_value_through_alias_and_name_is_fine():
    with pytest.warns(FutureWarning):
        assert make(evaluation_strategy="epoch", eval_strategy="epoch").eval_strategy is IntervalStrategy.EPOCH


def test_logging_dir_defaults_to_none():
    assert make().logging_dir is None


def test_aliases_work_for_dataclass_subclasses():
    @dataclasses.dataclass
    class MyArgs(TrainingArguments):
        extra: int = 1

    with pytest.warns(FutureWarning) as record:
        args = MyArgs(extra=3, evaluation_strategy="epoch", logging_dir="tb")
    assert [str(w.message).split(" is deprecated")[0] for w in record] == ["evaluation_strategy", "logging_dir"]
    assert (args.extra, args.eval_strategy, args.logging_dir) == (3, IntervalStrategy.EPOCH, "tb")
    assert "extra" in inspect.signature(MyArgs).parameters
    assert dataclasses.replace(args, extra=4).extra == 4


def test_aliases_work_through_a_hand_written_subclass_init():
    class Custom(TrainingArguments):
        def __init__(self, tag: str = "x", **kwargs):
            self.tag = tag
            super().__init__(**kwargs)

    with pytest.warns(FutureWarning):
        args = Custom(tag="t", no_cuda=True)
    assert args.tag == "t" and args.use_cpu is True


def test_subclass_field_named_like_an_alias_wins():
    @dataclasses.dataclass
    class Legacy(TrainingArguments):
        logging_dir: str = "mine"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Legacy(logging_dir="given").logging_dir == "given"
        assert Legacy().logging_dir == "mine"


# --- fields trainwell does not act on yet -----------------------------------------------------------------------------

UNSUPPORTED_SAMPLES = {
    "push_to_hub": True,
    "hub_model_id": "me/model",
    "hub_token": "hf_secret",
    "hub_private_repo": True,
    "hub_always_push": True,
    "hub_revision": "main",
    "parallelism_config": object(),
    "use_liger_kernel": True,
    "liger_kernel_config": {"rope": True},
    "neftune_noise_alpha": 5.0,
    "auto_find_batch_size": True,
    "debug": "underflow_overflow",
    "enable_jit_checkpoint": True,
    "eval_accumulation_steps": 4,
    "batch_eval_metrics": True,
    "include_for_metrics": ["loss"],
    "eval_use_gather_object": True,
    "save_on_each_node": True,
    "restore_callback_states_from_checkpoint": True,
    "project": "elsewhere",
    "trackio_space_id": "me/space",
    "trackio_bucket_id": "bucket",
    "trackio_static_space_id": "me/static",
    "skip_memory_metrics": False,
    "eval_do_concat_batches": False,
}


# Every value trainwell refuses: the rows of support.py, TPU metrics, and the mesh dimensions it does not run.
REFUSED = [(name, UNSUPPORTED_SAMPLES.get(name), f"TrainingArguments.{name}=")
           for name in sorted(set(support.UNSUPPORTED) | set(support._ALLOWED_VALUES))] + [
    ("debug", "tpu_metrics_debug", "TrainingArguments.debug='tpu_metrics_debug'"),
    ("parallelism_config", {"cp_size": 2}, "TrainingArguments.parallelism_config.cp_size=2"),
    ("parallelism_config", {"sp_size": 2}, "TrainingArguments.parallelism_config.sp_size=2"),
]


@pytest.mark.parametrize(("name", "value", "named"), REFUSED)
def test_unsupported_value_raises_when_set(name, value, named):
    assert value is not None, f"add a sample value for {name}"
    with pytest.raises(NotImplementedError) as err:
        make(**{name: value})
    assert named in str(err.value)


def test_parallelism_config_from_a_dict_or_json_and_back():
    from accelerate import ParallelismConfig

    for given in ({"dp_shard_size": 2, "tp_size": 2}, '{"dp_shard_size": 2, "tp_size": 2}'):
        config = make(parallelism_config=given).parallelism_config
        assert isinstance(config, ParallelismConfig) and (config.dp_shard_size, config.tp_size) == (2, 2)
    saved = make(parallelism_config={"tp_size": 2}).to_dict()["parallelism_config"]
    assert saved["tp_size"] == 2 and saved["dp_shard_size"] == 1
    given = ParallelismConfig(tp_size=2)
    assert make(parallelism_config=given).parallelism_config is given
    with pytest.raises(ValueError, match="parallelism_config got unknown key.*'tp_sise'.*tp_size"):
        make(parallelism_config={"tp_sise": 2})
    with pytest.raises(TypeError, match="parallelism_config=2: pass an accelerate.ParallelismConfig"):
        make(parallelism_config=2)


def test_unsupported_fields_at_their_defaults_are_fine():
    defaults = {name: default for name, default in EXPECTED_FIELDS if name in support.UNSUPPORTED}
    make(**defaults)


def test_supported_sampling_strategy_passes():
    assert make(train_sampling_strategy="sequential").train_sampling_strategy == "sequential"
