"""The reference's submodule paths: every name docs/compat.md offers imports from trainwell's module of the same
path, is the owner's object, and (when transformers is installed) exists at that path in the reference too."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util

import numpy as np
import pytest
import torch

PATHS = ["trainer_utils", "trainer_callback", "trainer_pt_utils", "optimization", "hf_argparser", "debug_utils",
         "utils.notebook"]
NEEDS_REFERENCE = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                     reason="transformers is not installed")


# The other trackers' callbacks and the reference's availability checks for them (tests/test_integrations_trackers.py).
TRACKER_NAMES = (
    "CometCallback", "ClearMLCallback", "NeptuneCallback", "DVCLiveCallback", "CodeCarbonCallback",
    "SwanLabCallback", "AzureMLCallback", "DagsHubCallback", "FlyteCallback", "KubeflowCallback",
    "get_available_reporting_integrations", "is_comet_available", "is_clearml_available", "is_neptune_available",
    "is_dvclive_available", "is_codecarbon_available", "is_swanlab_available", "is_azureml_available",
    "is_dagshub_available", "is_flytekit_available", "is_kubeflow_available",
)


def _offered():
    for path in PATHS:
        module = importlib.import_module(f"trainwell.{path}")
        for name in module.__all__:
            yield path, name
    collator = importlib.import_module("trainwell.data.data_collator")
    yield from (("data.data_collator", name) for name in collator.__all__ if name != "pad_features")
    for name in ("TensorBoardCallback", "MLflowCallback", "WandbCallback", "TrackioCallback",
                 "get_reporting_integration_callbacks", "is_tensorboard_available", "is_mlflow_available",
                 "is_wandb_available", "is_trackio_available", "is_deepspeed_available", "is_deepspeed_zero3_enabled",
                 "is_optuna_available", "is_ray_available", "is_ray_tune_available", "hp_params",
                 "run_hp_search_optuna", *TRACKER_NAMES):
        yield "integrations", name
    yield "trainer_seq2seq", "Seq2SeqTrainer"
    yield "training_args_seq2seq", "Seq2SeqTrainingArguments"
    for name in ("Trainer", "DEFAULT_CALLBACKS", "DEFAULT_PROGRESS_CALLBACK", "TRAINER_STATE_NAME",
                 "OPTIMIZER_NAME", "SCHEDULER_NAME", "SCALER_NAME", "TRAINING_ARGS_NAME"):
        yield "trainer", name


OFFERED = list(_offered())


@pytest.mark.parametrize("path,name", OFFERED, ids=[f"{p}.{n}" for p, n in OFFERED])
def test_offered_name_imports_from_the_reference_path(path, name):
    value = getattr(importlib.import_module(f"trainwell.{path}"), name)
    top = importlib.import_module("trainwell")
    if name in top.__all__:
        assert value is getattr(top, name)  # the owner's object, not a copy


@NEEDS_REFERENCE
@pytest.mark.parametrize("path,name", OFFERED, ids=[f"{p}.{n}" for p, n in OFFERED])
def test_the_reference_has_the_name_at_that_path(path, name):
    if path == "utils.notebook":
        pytest.importorskip("IPython")  # the reference's module imports IPython.display as it is imported
    assert hasattr(importlib.import_module(f"transformers.{path}"), name)


def test_every_offered_module_is_listed_in_the_docs():
    with open("docs/compat.md", encoding="utf-8") as fh:
        text = fh.read()
    for path, name in OFFERED:
        assert f"trainwell.{path}`" in text, path
        if not name.startswith("get_") or "schedule" not in name:  # the schedule builders are named as a group
            assert f"`{name}`" in text, f"{path}.{name} is not in docs/compat.md"


def test_no_name_is_both_offered_and_listed_as_not_offered():
    """docs/compat.md's "Not offered" bullets name, before their first colon, what trainwell leaves out: none of
    those names may be importable from trainwell (the page once listed the tracker callbacks on both lists)."""
    import re

    with open("docs/compat.md", encoding="utf-8") as fh:
        text = fh.read()
    section = text.split("## Not offered, on purpose", 1)[1].split("\n## ", 1)[0]
    bullets = re.split(r"^- ", section, flags=re.M)[1:]
    heads = [re.split(r"\)?\**:\s", bullet, maxsplit=1)[0] for bullet in bullets]
    listed = {name for head in heads for name in re.findall(r"`([A-Za-z_]\w*)`", head)}
    assert len(listed) >= 20, listed  # the parsing found the names
    modules = [importlib.import_module(f"trainwell.{path}") for path in {path for path, _ in OFFERED}]
    both = sorted(name for name in listed for module in modules + [importlib.import_module("trainwell")]
                  if hasattr(module, name))  # fmt: skip
    assert not both, f"docs/compat.md lists as not offered what trainwell offers: {both}"


def test_denumpify_detensorize():
    from trainwell.trainer_utils import denumpify_detensorize

    out = denumpify_detensorize({"a": np.float32(0.5), "b": [torch.tensor(2), np.int64(3)], "c": np.ones(2)})
    assert out["a"] == 0.5 and type(out["a"]) is float and out["b"] == [2, 3] and type(out["b"][0]) is int
    assert isinstance(out["c"], np.ndarray)  # arrays stay arrays


def test_nested_concat_pads_and_nested_truncate_cuts():
    from trainwell.trainer_pt_utils import nested_concat, nested_numpify, nested_truncate

    a, b = torch.ones(2, 3), torch.zeros(1, 5)
    joined = nested_concat({"x": (a,)}, {"x": (b,)}, padding_index=-100)
    assert joined["x"][0].shape == (3, 5) and joined["x"][0][0, 4] == -100 and joined["x"][0][2, 4] == 0
    assert nested_truncate(nested_numpify(joined), 2)["x"][0].shape == (2, 5)


def test_label_smoother_matches_the_formula():
    from trainwell.trainer_pt_utils import LabelSmoother

    logits, labels = torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(0)), torch.tensor(
        [[1, 2, -100, 3], [0, -100, 6, 5]])
    loss = LabelSmoother(epsilon=0.1)({"logits": logits}, labels)
    mask = labels != -100
    logp = torch.log_softmax(logits, -1)[mask]
    expected = 0.9 * torch.nn.functional.nll_loss(logp, labels[mask]) + 0.1 * (-logp.mean(-1)).mean()
    assert torch.allclose(loss, expected, atol=1e-6)


@NEEDS_REFERENCE
def test_label_smoother_equals_the_reference():
    from transformers.trainer_pt_utils import LabelSmoother as Reference

    from trainwell.trainer_pt_utils import LabelSmoother

    logits = torch.randn(2, 5, 11, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([[1, 2, -100, 3, 4], [0, -100, 6, 5, 10]])
    for shift in (False, True):
        ours = LabelSmoother(0.2)({"logits": logits}, labels, shift_labels=shift)
        assert torch.allclose(ours, Reference(0.2)({"logits": logits}, labels, shift_labels=shift), atol=1e-6)


def test_find_executable_batch_size_retries_smaller_on_out_of_memory():
    from trainwell.trainer_utils import find_executable_batch_size

    tried = []

    @find_executable_batch_size(starting_batch_size=128, auto_find_batch_size=True)
    def run(batch_size):
        tried.append(batch_size)
        if batch_size > 32:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 GB")
        return batch_size

    result = run()  # Accelerate shrinks the batch size after each out-of-memory error (by 10% in 1.15)
    assert result <= 32 and tried[0] == 128 and tried == sorted(tried, reverse=True) and tried[-1] == result
    assert find_executable_batch_size(lambda batch_size: batch_size, starting_batch_size=16)() == 16


def test_hfarg_aliases_and_help_reach_the_parser():
    from trainwell.hf_argparser import HfArg, HfArgumentParser

    @dataclasses.dataclass
    class Script:
        model_path: str = HfArg(default="m", aliases=["--model", "-m"], help="where the model is")

    (parsed,) = HfArgumentParser(Script).parse_args_into_dataclasses(["-m", "tiny"])
    assert parsed.model_path == "tiny"


def test_data_collator_mixin_dispatches_by_return_tensors():
    from trainwell.data.data_collator import DataCollatorMixin

    @dataclasses.dataclass
    class Counting(DataCollatorMixin):
        return_tensors: str = "pt"

        def torch_call(self, features):
            return torch.tensor([len(features)])

        def numpy_call(self, features):
            return np.array([len(features)])

    assert isinstance(Counting()([1, 2]), torch.Tensor)
    assert isinstance(Counting()([1, 2], return_tensors="np"), np.ndarray)
    with pytest.raises(ValueError, match="return_tensors='jax'"):
        Counting(return_tensors="jax")([1])


def test_tracker_availability_matches_the_registry():
    from trainwell.integrations import TRACKERS, is_deepspeed_zero3_enabled, is_tensorboard_available

    assert is_tensorboard_available() == TRACKERS["tensorboard"].installed()
    assert is_deepspeed_zero3_enabled() is False


def test_the_references_public_trainer_attributes(tmp_path):
    from tests.common.models import RegressionDataset, RegressionModel
    from tests.conftest import make_args
    from trainwell import Trainer

    trainer = Trainer(model=RegressionModel(), args=make_args(str(tmp_path)), train_dataset=RegressionDataset())
    assert trainer.is_deepspeed_enabled is False and trainer.is_fsdp_enabled is False
    assert trainer.place_model_on_device is True and trainer.is_model_parallel is False
    assert trainer.deepspeed is None and trainer.hp_name is None and trainer.hub_model_id is None
    assert trainer.neftune_noise_alpha is None
    assert trainer.get_tp_size() == trainer.get_cp_size() == trainer.get_sp_size() == 1
    assert trainer.gather_function(torch.ones(2)).tolist() == [1.0, 1.0]


def test_loaders_carry_total_batch_size_as_accelerates_do(tmp_path):
    from tests.common.models import RegressionDataset, RegressionModel
    from tests.conftest import make_args
    from trainwell import Trainer

    args = make_args(str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(),
                      eval_dataset=RegressionDataset())
    assert trainer.get_train_dataloader().total_batch_size == 4  # per step of the loader, not per optimizer step
    assert trainer.get_eval_dataloader().total_batch_size == 8


@pytest.mark.parametrize("package", ["trainwell", "trainwell.args", "trainwell.optim", "trainwell.integrations",
                                     "trainwell.trainer_utils", "trainwell.trainer_pt_utils", "trainwell.optimization",
                                     "trainwell.trainer_callback", "trainwell.hf_argparser", "trainwell.debug_utils"])
def test_every_lazy_export_resolves(package):
    """Each name a package exports lazily is found in the module it names (trainwell.args.ALIASES was not)."""
    module = importlib.import_module(package)
    for name in dir(module):
        if not name.startswith("_"):
            getattr(module, name)  # an AttributeError names the package and the name
