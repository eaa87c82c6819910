"""What the Trainer decides once, and where: the process set-up (seed, log level), the process roles of a train()
call, the seed of the data order, the model information, and the enum values handed to functions directly."""

from __future__ import annotations

import collections
import enum
import inspect
import logging

import pytest
import torch

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args
from trainwell import Trainer, wiring
from trainwell.data import loaders
from trainwell.data.train_loader import TrainFeed
from trainwell.loop.metric_checks import CheckedComputeMetrics
from trainwell.optim import param_groups
from trainwell.outputs import IntervalStrategy, enum_value
from trainwell.state import TrainerState
from trainwell.utils import model as model_utils

ROLES = ("is_local_process_zero", "is_world_process_zero")


@pytest.fixture
def library_logger(monkeypatch):
    """The ``trainwell`` logger, its level restored after the test, and every ``setLevel`` call on it recorded."""
    logger = logging.getLogger("trainwell")
    monkeypatch.setattr(logger, "level", logger.level)
    calls: list[int] = []
    set_level = logger.setLevel

    def recording(level):
        calls.append(level)
        set_level(level)

    monkeypatch.setattr(logger, "setLevel", recording)
    return calls


def test_the_log_level_is_set_once_when_the_trainer_is_built_and_not_by_train(out_dir, library_logger):
    args = make_args(out_dir, max_steps=2, log_level="error", log_level_replica="debug")
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16))
    assert library_logger == [logging.ERROR]
    trainer.train()
    assert library_logger == [logging.ERROR]


@pytest.fixture
def role_settings(monkeypatch):
    """How often each process role is given to a ``TrainerState``: as a constructor argument or assigned later.
    A state read back from a checkpoint (the roles of the process that saved it) does not count."""
    counts: collections.Counter = collections.Counter()
    inside = [0]  # within TrainerState.__init__ or from_dict: the values come from the arguments or the file
    init, load = TrainerState.__init__, TrainerState.from_dict.__func__

    def counting_init(self, *args, **kwargs):
        if not inside[0]:
            counts.update(role for role in ROLES if role in kwargs)
        inside[0] += 1
        try:
            init(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    def counting_setattr(self, name, value):
        if name in ROLES and not inside[0]:
            counts[name] += 1
        object.__setattr__(self, name, value)

    def loading(cls, data):
        inside[0] += 1
        try:
            return load(cls, data)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(TrainerState, "__init__", counting_init)
    monkeypatch.setattr(TrainerState, "__setattr__", counting_setattr)
    monkeypatch.setattr(TrainerState, "from_dict", classmethod(loading))
    return counts


def test_the_process_roles_are_set_once_per_train_call(out_dir, role_settings):
    args = make_args(out_dir, max_steps=4, save_strategy="steps", save_steps=2)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16))
    assert role_settings == dict.fromkeys(ROLES, 1)  # the state the Trainer starts with
    role_settings.clear()
    trainer.train()
    assert role_settings == dict.fromkeys(ROLES, 1)
    role_settings.clear()
    trainer.train(resume_from_checkpoint=True)
    assert role_settings == dict.fromkeys(ROLES, 1)
    assert trainer.state.is_world_process_zero is True and trainer.state.is_local_process_zero is True


def test_the_seed_is_set_when_built_and_again_only_before_model_init(out_dir, monkeypatch):
    seeds: list[int] = []
    monkeypatch.setattr(wiring, "set_seed", seeds.append)
    args = make_args(out_dir, max_steps=1, seed=7)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16))
    trainer.train()
    assert seeds == [7]
    seeds.clear()
    trainer = Trainer(model_init=lambda: RegressionModel(), args=args, train_dataset=RegressionDataset(length=16))
    trainer.train()
    trainer.train()
    assert seeds == [7, 7, 7]  # built, then once before each fresh model


def test_the_sampler_and_the_loader_generator_take_one_data_seed(out_dir, monkeypatch):
    monkeypatch.setattr(loaders, "data_seed", lambda args: 1234)
    args = make_args(out_dir, seed=1, data_seed=2)
    feed = TrainFeed.of(Trainer(model=RegressionModel(), args=args,
                                train_dataset=RegressionDataset(length=16)).get_train_dataloader())
    assert feed.sampler.seed == 1234 and feed.generator.initial_seed() == 1234


@pytest.mark.parametrize("seed, data_seed, expected", [(5, None, 5), (5, 9, 9), (5, 0, 0)])
def test_data_seed_falls_back_to_seed(seed, data_seed, expected):
    assert loaders.data_seed(make_args("o", seed=seed, data_seed=data_seed)) == expected


def test_model_info_lives_in_utils_and_reads_the_model_once(out_dir):
    class Tagger(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, token_labels=None, *rest, **kwargs):
            return {"loss": input_ids.float().sum()}

    info = model_utils.ModelInfo.of(Tagger())
    assert info.default_label_names == ["token_labels"] and info.main_input_name == "input_ids"
    assert info.signature_columns(["token_labels", "extra"]) == [
        "input_ids", "attention_mask", "token_labels", "extra", "label", "label_ids"]  # *rest, **kwargs: no column
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir))
    assert type(trainer.model_info) is model_utils.ModelInfo and not hasattr(wiring, "ModelInfo")
    assert inspect.getmodule(model_utils.ModelInfo) is model_utils


def test_compute_metrics_is_checked_whenever_it_is_set(out_dir):
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir))
    assert isinstance(type(trainer).__dict__["compute_metrics"], CheckedComputeMetrics)
    with pytest.raises(TypeError, match=r"^compute_metrics=3: pass a function"):
        trainer.compute_metrics = 3
    trainer.args.batch_eval_metrics = True
    with pytest.raises(ValueError, match="takes no compute_result argument"):
        trainer.compute_metrics = lambda prediction: {}
    trainer.compute_metrics = None
    assert trainer.compute_metrics is None


def test_the_optimizer_groups_read_back_before_and_after_creation():
    with pytest.raises(ValueError, match=r"not created yet: call create_optimizer\(\) or train\(\) first"):
        param_groups.learning_rates(None)
    model = RegressionModel()
    optimizer = torch.optim.SGD([{"params": [model.a], "lr": 0.1}, {"params": [model.b], "lr": 0.2}])
    assert param_groups.learning_rates(optimizer) == [0.1, 0.2]
    assert param_groups.group_of(optimizer, model.b)["lr"] == 0.2
    assert param_groups.group_of(optimizer, torch.nn.Parameter(torch.zeros(1))) is None
    assert param_groups.group_of(optimizer) == [[model.a], [model.b]]


class _Foreign(enum.Enum):  # an enum of another library: not a str, and str() is "_Foreign.STEPS"
    STEPS = "steps"


@pytest.mark.parametrize("value, expected", [(IntervalStrategy.STEPS, "steps"), (_Foreign.STEPS, "steps"),
                                             ("steps", "steps"), (None, None), (3, 3)])
def test_enum_value_of_ours_anothers_or_a_plain_value(value, expected):
    result = enum_value(value)
    assert result == expected and type(result) is type(expected)


def test_normalized_enum_fields_compare_and_print_as_their_strings():
    """Why the loops compare ``args.save_strategy == "best"`` with no unwrapping."""
    args = make_args("o", eval_strategy=_Foreign.STEPS, save_strategy="best", metric_for_best_model="loss",
                     load_best_model_at_end=True)
    assert isinstance(args.eval_strategy, IntervalStrategy) and args.eval_strategy == "steps"
    assert args.save_strategy == "best" and str(args.save_strategy) == "best" and f"{args.eval_strategy}" == "steps"
