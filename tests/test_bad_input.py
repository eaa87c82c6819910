"""Every bad ``TrainingArguments`` value is caught at construction, naming the argument, the value and the fix.

One table: (kwargs, the exception or warning class expected, a regex the message must match). Each regex holds the
argument's name and the value's repr, and the test also checks ``name=repr(value)`` of the first keyword literally.
Values that cannot do anything sensible raise; values that still do something (the reference runs with them) warn.
``<FILE>`` in a value becomes the path of an existing file, ``<DIR>`` that of a directory this process cannot write
to (``os.access`` is patched: the tests may run as root); in a regex, either becomes the escaped path.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings

import pytest

from trainwell.training_args import TrainingArguments

NAN, INF = float("nan"), float("inf")
_STEPS = {"eval_strategy": "steps"}

ROWS: list[tuple[dict, type, str]] = [
    # --- NaN and infinity pass every comparison (nan < 0 is False): refused first, for every float field ---
    ({"learning_rate": INF}, ValueError, r"^learning_rate=inf: pass a finite number \(the default is 5e-05\)"),
    ({"learning_rate": NAN}, ValueError, r"^learning_rate=nan: pass a finite number"),
    ({"learning_rate": -INF}, ValueError, r"^learning_rate=-inf: pass a finite number"),
    ({"learning_rate": "nan"}, ValueError, r"^learning_rate=nan: pass a finite number"),
    ({"weight_decay": NAN}, ValueError, r"^weight_decay=nan: pass a finite number \(the default is 0\.0\)"),
    ({"weight_decay": INF}, ValueError, r"^weight_decay=inf: pass a finite number"),
    ({"num_train_epochs": NAN}, ValueError, r"^num_train_epochs=nan: pass a finite number"),
    ({"num_train_epochs": INF}, ValueError, r"^num_train_epochs=inf with max_steps=-1 never ends: .*max_steps > 0"),
    ({"warmup_steps": NAN}, ValueError, r"^warmup_steps=nan: pass a finite number"),
    ({"warmup_steps": INF}, ValueError, r"^warmup_steps=inf: pass a finite number"),
    ({"adam_beta1": NAN}, ValueError, r"^adam_beta1=nan: pass a finite number"),
    ({"adam_beta2": INF}, ValueError, r"^adam_beta2=inf: pass a finite number"),
    ({"adam_epsilon": NAN}, ValueError, r"^adam_epsilon=nan: pass a finite number"),
    ({"adam_epsilon": INF}, ValueError, r"^adam_epsilon=inf: pass a finite number"),
    ({"max_grad_norm": NAN}, ValueError, r"^max_grad_norm=nan turns gradient clipping off silently: .*0 to disable"),
    ({"label_smoothing_factor": NAN}, ValueError, r"^label_smoothing_factor=nan: pass a finite number"),
    ({"neftune_noise_alpha": INF}, ValueError, r"^neftune_noise_alpha=inf: pass a finite number \(None, the default\)"),
    ({"logging_steps": NAN}, ValueError, r"^logging_steps=nan: pass a finite number \(the default is 500\)"),
    ({"save_steps": INF}, ValueError, r"^save_steps=inf: pass a finite number"),
    ({"eval_steps": NAN, **_STEPS}, ValueError, r"^eval_steps=nan: pass a finite number \(None, the default\)"),
    ({"eval_delay": NAN}, ValueError, r"^eval_delay=nan: pass a finite number"),
    ({"eval_delay": INF}, ValueError, r"^eval_delay=inf: pass a finite number"),
    # --- ranges: refused where torch, numpy or the loss would fail or do nonsense ---
    ({"adam_beta1": 1.0}, ValueError, r"^adam_beta1=1\.0: pass a decay rate in \[0, 1\), such as 0\.9"),
    ({"adam_beta1": -0.1}, ValueError, r"^adam_beta1=-0\.1: pass a decay rate in \[0, 1\)"),
    ({"adam_beta2": 1.5}, ValueError, r"^adam_beta2=1\.5: pass a decay rate in \[0, 1\), such as 0\.999"),
    ({"adam_beta2": -0.001}, ValueError, r"^adam_beta2=-0\.001: pass a decay rate"),
    ({"adam_epsilon": -1e-8}, ValueError, r"^adam_epsilon=-1e-08: pass a small number >= 0"),
    ({"weight_decay": -0.01}, ValueError, r"^weight_decay=-0\.01: pass 0 \(no weight decay\) or a positive rate"),
    ({"label_smoothing_factor": 1.5}, ValueError, r"^label_smoothing_factor=1\.5: pass a factor in \[0, 1\)"),
    ({"label_smoothing_factor": -0.1}, ValueError, r"^label_smoothing_factor=-0\.1: pass a factor in \[0, 1\)"),
    ({"seed": -1}, ValueError, r"^seed=-1: pass an integer from 0 to 2\*\*32 - 1"),
    ({"seed": 2**32}, ValueError, r"^seed=4294967296: pass an integer from 0 to 2\*\*32 - 1"),
    ({"data_seed": 2**64}, ValueError, r"^data_seed=18446744073709551616: pass an integer torch\.Generator"),
    ({"data_seed": -(2**63) - 1}, ValueError, r"^data_seed=-9223372036854775809: .*or None to use seed"),
    ({"neftune_noise_alpha": -1.0}, ValueError, r"^neftune_noise_alpha=-1\.0: pass a positive noise scale"),
    ({"neftune_noise_alpha": 0}, ValueError, r"^neftune_noise_alpha=0: .*or None to turn NEFTune off"),
    ({"dataloader_prefetch_factor": 0, "dataloader_num_workers": 2}, ValueError,
     r"^dataloader_prefetch_factor=0: pass a positive number of batches"),
    ({"ddp_timeout": 0}, ValueError, r"^ddp_timeout=0: pass a positive number of seconds"),
    ({"ddp_timeout": -5}, ValueError, r"^ddp_timeout=-5: pass a positive number of seconds"),
    # --- odd values the reference runs with: kept, with a warning saying what they do ---
    ({"max_steps": -5}, UserWarning, r"^max_steps=-5 is the same as max_steps=-1: .*max_steps > 0"),
    ({"max_steps": -2}, UserWarning, r"^max_steps=-2 is the same as max_steps=-1"),
    ({"max_grad_norm": -1.0}, UserWarning, r"^max_grad_norm=-1\.0 disables gradient clipping, as 0 does"),
    ({"save_total_limit": -1}, UserWarning, r"^save_total_limit=-1 keeps every checkpoint.*Pass None"),
    ({"save_total_limit": 0}, UserWarning, r"^save_total_limit=0 keeps every checkpoint.*save_strategy='no'"),
    ({"eval_delay": -1}, UserWarning, r"^eval_delay=-1 is the same as eval_delay=0"),
    ({"num_train_epochs": 0}, UserWarning, r"^num_train_epochs=0 with max_steps=-1: train\(\) would run no"),
    ({"num_train_epochs": 0.0, "max_steps": 0}, UserWarning, r"^num_train_epochs=0\.0 with max_steps=0"),
    ({"label_smoothing_factor": 1.0}, UserWarning, r"^label_smoothing_factor=1\.0 makes every target uniform"),
    # --- kinds and types ---
    ({"logging_first_step": "maybe"}, ValueError, r"^logging_first_step='maybe': pass True or False"),
    ({"bf16": "sometimes"}, ValueError, r"^bf16='sometimes': pass True or False"),
    ({"greater_is_better": "higher"}, ValueError, r"^greater_is_better='higher': pass True or False"),
    ({"tf32": "auto"}, ValueError, r"^tf32='auto': pass True or False"),
    ({"report_to": 123}, ValueError, r"^report_to=123: pass a tracker name such as 'tensorboard', a list of names"),
    ({"report_to": ["wandb", 3]}, ValueError, r"^report_to=\['wandb', 3\]: 3 is not a tracker"),
    ({"report_to": "wandbb"}, ValueError, r"^report_to='wandbb': .*Did you mean 'wandb'\?"),
    ({"learning_rat": 1e-4}, TypeError,
     r"unexpected keyword argument 'learning_rat': learning_rat=0\.0001 is not a TrainingArguments argument\. "
     r"Did you mean 'learning_rate'\?"),
    ({"per_device_train_bach_size": 4}, TypeError,
     r"per_device_train_bach_size=4 is not a TrainingArguments argument\. Did you mean 'per_device_train_batch_size'"),
    ({"eval_stratgy": "steps"}, TypeError, r"eval_stratgy='steps' is not .*Did you mean 'eval_strategy'\?"),
    ({"zzz_qqq": 1}, TypeError, r"zzz_qqq=1 is not a TrainingArguments argument\. See help\(TrainingArguments\)"),
    ({"label_names": "labels"}, ValueError, r"^label_names='labels': pass a list of names such as \['labels'\]"),
    ({"label_names": ["labels", 3]}, ValueError, r"^label_names=\['labels', 3\]: pass a list of names"),
    ({"optim_target_modules": 3}, ValueError, r"^optim_target_modules=3: pass a list of names .* or one name"),
    ({"metric_for_best_model": 3}, ValueError, r"^metric_for_best_model=3: pass the name of a metric"),
    ({"learning_rate": "fast"}, ValueError, r"^learning_rate='fast': pass a number \(float\)"),
    ({"max_steps": 1.5}, ValueError, r"^max_steps=1\.5: pass a whole number"),
    ({"seed": True}, ValueError, r"^seed=True: pass a number \(int\)"),
    # --- output_dir: what can be known without creating anything ---
    ({"output_dir": ""}, ValueError, r"^output_dir='': pass the directory .* unset \(None\) to use 'trainer_output'"),
    ({"output_dir": 123}, TypeError, r"^output_dir=123: pass a directory path \(a str or os\.PathLike\)"),
    ({"output_dir": "<FILE>"}, ValueError, r"^output_dir=<FILE> is a file: pass a directory path"),
    ({"output_dir": "<FILE>/run"}, ValueError, r"^output_dir=<FILE>/run lies under .* which is a file"),
    ({"output_dir": "<DIR>"}, UserWarning, r"^output_dir=<DIR> is not writable by this process"),
    ({"output_dir": "<DIR>/run"}, UserWarning, r"^output_dir=<DIR>/run cannot be created: .* is not writable"),
    # --- checked before this table existed: kept here so that one table lists every bad value ---
    ({"per_device_train_batch_size": 0}, ValueError, r"^per_device_train_batch_size=0: pass a positive integer"),
    ({"per_device_eval_batch_size": -1}, ValueError, r"^per_device_eval_batch_size=-1: pass a positive integer"),
    ({"gradient_accumulation_steps": 0}, ValueError, r"^gradient_accumulation_steps=0: pass an integer >= 1"),
    ({"learning_rate": -1e-3}, ValueError, r"^learning_rate=-0\.001: pass a learning rate >= 0"),
    ({"num_train_epochs": -1}, ValueError, r"^num_train_epochs=-1: pass a number of epochs >= 0"),
    ({"warmup_steps": -1}, ValueError, r"^warmup_steps=-1: pass 0 \(no warmup\)"),
    ({"save_steps": 0}, ValueError, r"^save_steps=0: pass a positive integer .*or save_strategy='no'"),
    ({"logging_steps": -10}, ValueError, r"^logging_steps=-10: pass a positive integer .*logging_strategy='no'"),
    ({"eval_steps": -5, **_STEPS}, ValueError, r"^eval_steps=-5: pass a positive integer .*eval_strategy='no'"),
    ({"dataloader_num_workers": -1}, ValueError, r"^dataloader_num_workers=-1: pass 0"),
    ({"torch_empty_cache_steps": 0}, ValueError, r"^torch_empty_cache_steps=0: pass a positive integer"),
    ({"eval_accumulation_steps": 0}, ValueError, r"^eval_accumulation_steps=0: pass a positive number"),
    ({"optim": "adamw_torh"}, ValueError, r"^optim='adamw_torh' is not a valid value: .*Did you mean"),
    ({"lr_scheduler_type": "cosin"}, ValueError, r"^lr_scheduler_type='cosin' is not a valid value: .*'cosine'"),
    ({"save_strategy": "epochs"}, ValueError, r"^save_strategy='epochs' is not a valid value: .*'epoch'"),
    ({"log_level": "loud"}, ValueError, r"^log_level='loud' is not a valid value"),
    ({"include_for_metrics": ["input"]}, ValueError, r"^include_for_metrics='input' is not .*Did you mean 'inputs'"),
    ({"torch_compile_mode": "fast"}, ValueError, r"^torch_compile_mode='fast' is not a valid value"),
    ({"lr_scheduler_kwargs": "warmup"}, ValueError, r"^lr_scheduler_kwargs='warmup': pass a dict"),
    # --- every other field: a value of the wrong kind or outside its choices ---
    ({"average_tokens_across_devices": "maybe"}, ValueError,
     r"^average_tokens_across_devices='maybe': pass True or False"),
    ({"fp16": "maybe"}, ValueError, r"^fp16='maybe': pass True or False"),
    ({"bf16_full_eval": "maybe"}, ValueError, r"^bf16_full_eval='maybe': pass True or False"),
    ({"activation_checkpointing": "maybe"}, ValueError, r"^activation_checkpointing='maybe': pass True or False"),
    ({"gradient_checkpointing": "maybe"}, ValueError, r"^gradient_checkpointing='maybe': pass True or False"),
    ({"torch_compile": "maybe"}, ValueError, r"^torch_compile='maybe': pass True or False"),
    ({"use_liger_kernel": "maybe"}, ValueError, r"^use_liger_kernel='maybe': pass True or False"),
    ({"use_cache": "maybe"}, ValueError, r"^use_cache='maybe': pass True or False"),
    ({"auto_find_batch_size": "maybe"}, ValueError, r"^auto_find_batch_size='maybe': pass True or False"),
    ({"log_on_each_node": "maybe"}, ValueError, r"^log_on_each_node='maybe': pass True or False"),
    ({"logging_nan_inf_filter": "maybe"}, ValueError, r"^logging_nan_inf_filter='maybe': pass True or False"),
    ({"disable_tqdm": "maybe"}, ValueError, r"^disable_tqdm='maybe': pass True or False"),
    ({"prediction_loss_only": "maybe"}, ValueError, r"^prediction_loss_only='maybe': pass True or False"),
    ({"eval_on_start": "maybe"}, ValueError, r"^eval_on_start='maybe': pass True or False"),
    ({"eval_do_concat_batches": "maybe"}, ValueError, r"^eval_do_concat_batches='maybe': pass True or False"),
    ({"eval_use_gather_object": "maybe"}, ValueError, r"^eval_use_gather_object='maybe': pass True or False"),
    ({"batch_eval_metrics": "maybe"}, ValueError, r"^batch_eval_metrics='maybe': pass True or False"),
    ({"save_only_model": "maybe"}, ValueError, r"^save_only_model='maybe': pass True or False"),
    ({"save_on_each_node": "maybe"}, ValueError, r"^save_on_each_node='maybe': pass True or False"),
    ({"enable_jit_checkpoint": "maybe"}, ValueError, r"^enable_jit_checkpoint='maybe': pass True or False"),
    ({"push_to_hub": "maybe"}, ValueError, r"^push_to_hub='maybe': pass True or False"),
    ({"hub_private_repo": "maybe"}, ValueError, r"^hub_private_repo='maybe': pass True or False"),
    ({"hub_always_push": "maybe"}, ValueError, r"^hub_always_push='maybe': pass True or False"),
    ({"load_best_model_at_end": "maybe"}, ValueError, r"^load_best_model_at_end='maybe': pass True or False"),
    ({"ignore_data_skip": "maybe"}, ValueError, r"^ignore_data_skip='maybe': pass True or False"),
    ({"restore_callback_states_from_checkpoint": "maybe"}, ValueError,
     r"^restore_callback_states_from_checkpoint='maybe': pass True or False"),
    ({"full_determinism": "maybe"}, ValueError, r"^full_determinism='maybe': pass True or False"),
    ({"use_cpu": "maybe"}, ValueError, r"^use_cpu='maybe': pass True or False"),
    ({"dataloader_drop_last": "maybe"}, ValueError, r"^dataloader_drop_last='maybe': pass True or False"),
    ({"dataloader_pin_memory": "maybe"}, ValueError, r"^dataloader_pin_memory='maybe': pass True or False"),
    ({"dataloader_persistent_workers": "maybe"}, ValueError,
     r"^dataloader_persistent_workers='maybe': pass True or False"),
    ({"dataloader_in_order": "maybe"}, ValueError, r"^dataloader_in_order='maybe': pass True or False"),
    ({"remove_unused_columns": "maybe"}, ValueError, r"^remove_unused_columns='maybe': pass True or False"),
    ({"ddp_find_unused_parameters": "maybe"}, ValueError, r"^ddp_find_unused_parameters='maybe': pass True or False"),
    ({"ddp_broadcast_buffers": "maybe"}, ValueError, r"^ddp_broadcast_buffers='maybe': pass True or False"),
    ({"ddp_static_graph": "maybe"}, ValueError, r"^ddp_static_graph='maybe': pass True or False"),
    ({"skip_memory_metrics": "maybe"}, ValueError, r"^skip_memory_metrics='maybe': pass True or False"),
    ({"do_train": "maybe"}, ValueError, r"^do_train='maybe': pass True or False"),
    ({"do_eval": "maybe"}, ValueError, r"^do_eval='maybe': pass True or False"),
    ({"do_predict": "maybe"}, ValueError, r"^do_predict='maybe': pass True or False"),
    ({"save_async": "maybe"}, ValueError, r"^save_async='maybe': pass True or False"),
    ({"verify_checkpoint_checksums": "often"}, ValueError, r"^verify_checkpoint_checksums='often': pass True or"),
    ({"log_throughput": "sometimes"}, ValueError, r"^log_throughput='sometimes': pass True or"),
    ({"skip_nonfinite_steps": "often"}, ValueError, r"^skip_nonfinite_steps='often': pass True or"),
    ({"rollback_on_spike": 0.5}, ValueError, r"^rollback_on_spike=0.5: pass a factor above 1"),
    ({"rollback_on_spike": float("inf")}, ValueError, r"^rollback_on_spike=inf: pass a finite number"),
    ({"rollback_on_spike": 5.0, "save_strategy": "no"}, ValueError,
     r"^rollback_on_spike=5.0 with save_strategy='no': a rollback reloads"),
    ({"rollback_on_spike": 5.0, "logging_strategy": "no"}, ValueError,
     r"^rollback_on_spike=5.0 with logging_strategy='no'"),
    ({"step_timeout": "soon"}, ValueError, r"^step_timeout='soon': pass a number of seconds"),
    ({"step_timeout": 0}, ValueError, r"^step_timeout=0: pass at least 1 second"),
    ({"step_timeout": float("nan")}, ValueError, r"^step_timeout=nan: pass at least 1 second"),
    ({"output_staging_dir": "stage"}, ValueError, r"^output_staging_dir='stage' is for a run whose output_dir"),
    ({"storage_options": 5}, ValueError, r"^storage_options=5: pass a dict or a JSON object string"),
    ({"fp16_full_eval": 3}, ValueError, r"^fp16_full_eval=3: pass True or False\.$"),
    ({"run_name": 42}, ValueError, r"^run_name=42: pass a string"),
    ({"project": 42}, ValueError, r"^project=42: pass a string"),
    ({"trackio_space_id": 42}, ValueError, r"^trackio_space_id=42: pass a string"),
    ({"trackio_bucket_id": 42}, ValueError, r"^trackio_bucket_id=42: pass a string"),
    ({"trackio_static_space_id": 42}, ValueError, r"^trackio_static_space_id=42: pass a string"),
    ({"hub_token": 42}, ValueError, r"^hub_token=42: pass a string"),
    ({"hub_model_id": 42}, ValueError, r"^hub_model_id=42: pass a string"),
    ({"hub_revision": 42}, ValueError, r"^hub_revision=42: pass a string"),
    ({"length_column_name": 42}, ValueError, r"^length_column_name=42: pass a string"),
    ({"resume_from_checkpoint": 42}, ValueError, r"^resume_from_checkpoint=42: pass a string"),
    ({"optim_args": 42}, ValueError, r"^optim_args=42: pass a 'key=value,key2=value2' string"),
    ({"activation_checkpointing_kwargs": "notjson"}, ValueError,
     r"^activation_checkpointing_kwargs='notjson': pass a dict"),
    ({"gradient_checkpointing_kwargs": 5}, ValueError, r"^gradient_checkpointing_kwargs=5: pass a dict"),
    ({"torch_compile_backend": "fastest"}, ValueError, r"^torch_compile_backend='fastest' is not a valid value"),
    ({"liger_kernel_config": "x"}, ValueError, r"^liger_kernel_config='x': pass a dict of Liger options"),
    ({"logging_strategy": "sometimes"}, ValueError, r"^logging_strategy='sometimes' is not a valid value"),
    ({"include_num_input_tokens_seen": "sometimes"}, ValueError,
     r"^include_num_input_tokens_seen='sometimes' is not a valid value"),
    ({"log_level_replica": "loud"}, ValueError, r"^log_level_replica='loud' is not a valid value"),
    ({"hub_strategy": "sometimes"}, ValueError, r"^hub_strategy='sometimes' is not a valid value"),
    ({"accelerator_config": 42}, TypeError, r"^accelerator_config=42: pass a dict, a JSON file path"),
    ({"parallelism_config": 42}, TypeError, r"^parallelism_config=42: pass an accelerate\.ParallelismConfig"),
    ({"dataloader_multiprocessing_context": "bogus"}, ValueError,
     r"^dataloader_multiprocessing_context='bogus' is not a valid value: choose one of 'fork'"),
    ({"train_sampling_strategy": "shuffled"}, ValueError, r"^train_sampling_strategy='shuffled' is not a valid"),
    ({"ddp_bucket_cap_mb": -5}, ValueError, r"^ddp_bucket_cap_mb=-5: pass a positive number of megabytes"),
    ({"ddp_backend": "carrier-pigeon"}, ValueError, r"^ddp_backend='carrier-pigeon' is not a valid value"),
    ({"fsdp": 42}, ValueError, r"^fsdp=42: pass True, an option string such as 'full_shard auto_wrap'"),
    ({"fsdp_config": 42}, ValueError, r"^fsdp_config=42 without fsdp: the config only applies when FSDP is on"),
    ({"deepspeed": 42}, ValueError, r"^deepspeed=42: pass the path of a DeepSpeed JSON config"),
    ({"debug": "everything"}, ValueError, r"^debug='everything' is not a valid value"),
    ({"local_rank": "x"}, ValueError, r"^local_rank='x': pass a number \(int\)"),
]


def _ids(row: tuple[dict, type, str]) -> str:
    return ",".join(f"{k}={v!r}" for k, v in row[0].items())[:60]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default output_dir ('trainer_output') is relative
    monkeypatch.setenv("HOME", str(tmp_path))  # output_dir='~/...' expands under a writable home


def _materialize(kwargs: dict, pattern: str, tmp_path, monkeypatch) -> tuple[dict, str]:
    """Put real paths in place of <FILE> and <DIR>, in the kwargs and (escaped, as repr) in the regex."""
    file_path, dir_path = str(tmp_path / "a_file"), str(tmp_path / "read_only")
    out = {}
    for name, value in kwargs.items():
        if isinstance(value, str) and value.startswith(("<FILE>", "<DIR>")):
            if value.startswith("<FILE>"):
                open(file_path, "w").close()
            else:
                os.mkdir(dir_path)
                monkeypatch.setattr(os, "access", lambda p, mode, real=os.access: p != dir_path and real(p, mode))
            value = value.replace("<FILE>", file_path).replace("<DIR>", dir_path)
            pattern = pattern.replace(f"={kwargs[name]}", "=" + re.escape(repr(value)))
        out[name] = value
    return out, pattern


@pytest.mark.parametrize("kwargs, expected, pattern", ROWS, ids=[_ids(r) for r in ROWS])
def test_bad_value_is_named_with_its_fix(kwargs, expected, pattern, tmp_path, monkeypatch):
    kwargs, pattern = _materialize(kwargs, pattern, tmp_path, monkeypatch)
    name, value = next(iter(kwargs.items()))
    assert name in pattern, "the regex must name the argument"
    if issubclass(expected, Warning):
        with pytest.warns(expected, match=pattern) as record:
            assert isinstance(TrainingArguments(**kwargs), TrainingArguments)
        messages = [str(w.message) for w in record if issubclass(w.category, expected)]
    else:
        with pytest.raises(expected, match=pattern) as err:
            TrainingArguments(**kwargs)
        messages = [str(err.value)]
    shown = [f"{name}={value!r}"]
    if isinstance(value, str) and value.lower() in ("nan", "inf"):  # a numeric string is shown as the number
        shown.append(f"{name}={float(value)!r}")
    if isinstance(value, list):  # a list may be reported by its bad item
        shown += [f"{name}={item!r}" for item in value]
    assert any(s in m for s in shown for m in messages), (shown, messages)


# Edge values that must keep working, silently (any warning fails the test), as they do with the reference.
GOOD = [
    {"adam_beta1": 0.0}, {"adam_beta2": 0.0}, {"adam_beta2": 0.9999}, {"adam_epsilon": 0.0},
    {"weight_decay": 0.0}, {"learning_rate": 0.0}, {"max_steps": -1}, {"max_steps": 0}, {"max_steps": 10},
    {"eval_delay": 0}, {"eval_delay": 2.5, "eval_strategy": "epoch"}, {"seed": 0}, {"seed": 2**32 - 1},
    {"data_seed": -1}, {"data_seed": 2**64 - 1}, {"data_seed": 0},
    {"label_smoothing_factor": 0.0}, {"label_smoothing_factor": 0.999},
    {"max_grad_norm": 0}, {"max_grad_norm": 0.0}, {"max_grad_norm": INF},
    {"num_train_epochs": INF, "max_steps": 10}, {"num_train_epochs": 0, "max_steps": 10}, {"num_train_epochs": 0.5},
    {"warmup_steps": 0.999}, {"save_total_limit": 1}, {"save_total_limit": None},
    {"neftune_noise_alpha": 5.0}, {"neftune_noise_alpha": None},
    {"dataloader_prefetch_factor": 1, "dataloader_num_workers": 1}, {"ddp_timeout": 1},
    {"eval_strategy": "steps", "eval_steps": 0},  # the reference's "unset": eval_steps follows logging_steps
    {"output_dir": None}, {"output_dir": "runs/new/deep"}, {"output_dir": "~/trainwell-out"},
    {"label_names": ["labels"]}, {"label_names": ("start_positions", "end_positions")}, {"label_names": []},
    {"optim_target_modules": "all-linear"}, {"optim_target_modules": ["attn", "mlp"]},
    {"report_to": []}, {"report_to": None}, {"report_to": ("jsonl", "csv")},
    {"metric_for_best_model": "accuracy"}, {"use_cpu": 1}, {"bf16": False},
]


@pytest.mark.parametrize("kwargs", GOOD, ids=[",".join(f"{k}={v!r}" for k, v in g.items()) for g in GOOD])
def test_good_edge_values_still_work(kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args = TrainingArguments(**kwargs)
    for name, value in kwargs.items():
        if name not in ("output_dir", "report_to", "eval_steps", "label_names"):
            assert getattr(args, name) == value


def test_an_existing_writable_output_dir_is_fine(tmp_path):
    (tmp_path / "run").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TrainingArguments(output_dir=str(tmp_path / "run")).output_dir == str(tmp_path / "run")
        assert TrainingArguments(output_dir=tmp_path / "run").output_dir == str(tmp_path / "run")
    assert not (tmp_path / "trainer_output").exists()  # construction creates nothing


@pytest.mark.parametrize(
    "given, expected",
    [("yes", True), ("True", True), ("1", True), ("y", True), ("no", False), ("FALSE", False), ("0", False),
     (" no ", False), (True, True), (False, False)],
)
def test_bool_strings_are_read_like_the_argument_parser(given, expected):
    args = TrainingArguments(logging_first_step=given, save_only_model=given, greater_is_better=given)
    assert args.logging_first_step is expected and args.save_only_model is expected
    assert args.greater_is_better is expected


def test_bool_strings_are_read_before_anything_uses_them():
    # "false" kept as a string would be truthy: mixed precision on, pinned memory off.
    args = TrainingArguments(fp16="false", use_cpu="false", push_to_hub="no", hub_private_repo="false")
    assert (args.fp16, args.use_cpu, args.mixed_precision, args.dataloader_pin_memory) == (False, False, "no", True)
    assert args.hub_private_repo is None  # a 4.x dump's inert False, once read as a bool


def test_include_for_metrics_accepts_one_name_as_the_reference_does():
    assert TrainingArguments(include_for_metrics="inputs").include_for_metrics == ["inputs"]
    assert TrainingArguments(include_for_metrics="inputs,loss").include_for_metrics == ["inputs", "loss"]


def test_unknown_keyword_of_a_subclass_suggests_its_own_fields():
    @dataclasses.dataclass
    class MyArgs(TrainingArguments):
        temperature: float = 1.0

    assert MyArgs(temperature=0.5).temperature == 0.5
    with pytest.raises(TypeError, match=r"temperatur=0\.5 is not a MyArgs argument\. Did you mean 'temperature'\?"):
        MyArgs(temperatur=0.5)
    with pytest.warns(FutureWarning, match="evaluation_strategy is deprecated"):  # 4.x names still go through
        assert MyArgs(evaluation_strategy="epoch").eval_strategy == "epoch"


def test_subclass_float_fields_are_left_to_the_subclass():
    @dataclasses.dataclass
    class MyArgs(TrainingArguments):
        max_length_ratio: float = INF  # infinity as "no limit" is the subclass's business

    assert MyArgs().max_length_ratio == INF


def test_replace_revalidates():
    args = TrainingArguments()
    with pytest.raises(ValueError, match=r"^adam_beta2=1\.0: "):
        dataclasses.replace(args, adam_beta2=1.0)


def test_setters_check_the_values_they_set():
    from trainwell import TrainingArguments

    args = TrainingArguments("out")
    with pytest.raises(ValueError, match=r"adam_beta1=1\.5"):
        args.set_optimizer(beta1=1.5)
    with pytest.raises(ValueError, match=r"learning_rate=nan"):
        TrainingArguments("out").set_training(learning_rate=float("nan"))
    assert TrainingArguments("out").set_logging(first_step="no").logging_first_step is False


def test_every_field_has_a_row():
    covered = {name for kwargs, _, _ in ROWS for name in kwargs}
    fields = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    assert sorted(fields - covered) == []
