"""Training order: the Trainer's length-grouped sampler (seeded, resumable, lengths computed once), the
reference's public LengthGroupedSampler / DistributedLengthGroupedSampler, and the strategies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from tests.common.models import RegressionDataset, RegressionModel, TinyTokenLM
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.data.length_grouped import (
    ResumableLengthGroupedSampler,
    grouped_order,
    sample_lengths,
)
from trainwell.data.samplers import ResumableSampler
from trainwell.data.train_loader import TrainFeed
from trainwell.trainer_pt_utils import DistributedLengthGroupedSampler, LengthGroupedSampler


class Tokens(Dataset):
    """Sequences of lengths 1..40 (seeded); counts __getitem__ calls; no __iter__ and never IndexError."""

    def __init__(self, n: int = 60, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(1, 41, (n,), generator=g).tolist()
        self.calls = 0

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):  # wraps around instead of raising IndexError: `for x in dataset` never ends
        self.calls += 1
        n = self.lengths[i % len(self.lengths)]
        return {"input_ids": torch.arange(1, n + 1) % 16 + 1, "labels": torch.arange(n) % 16}


def _spread(order, lengths, batch):
    chunks = [order[i:i + batch] for i in range(0, len(order), batch)]
    return np.mean([max(lengths[j] for j in c) - min(lengths[j] for j in c) for c in chunks])


def test_grouped_order_is_a_grouped_permutation_with_longest_first():
    lengths = Tokens(200).lengths
    order = grouped_order(lengths, 8, torch.Generator().manual_seed(3))
    assert sorted(order) == list(range(200))
    assert lengths[order[0]] == max(lengths)
    random_order = torch.randperm(200, generator=torch.Generator().manual_seed(3)).tolist()
    assert _spread(order, lengths, 8) < 0.5 * _spread(random_order, lengths, 8)


def test_length_grouped_sampler_is_a_function_of_seed_and_epoch():
    lengths = Tokens(100).lengths
    a, b = ResumableLengthGroupedSampler(lengths, 4, seed=7), ResumableLengthGroupedSampler(lengths, 4, seed=7)
    torch.manual_seed(0)
    first = list(a)
    torch.manual_seed(123)  # the global RNG plays no part
    assert list(b) == first
    a.set_epoch(1)
    assert list(a) != first and sorted(a) == list(range(100))
    assert list(ResumableLengthGroupedSampler(lengths, 4, seed=8)) != first
    state = torch.random.get_rng_state()
    list(a)
    assert torch.equal(state, torch.random.get_rng_state())


def test_length_grouped_sampler_resumes_like_resumable_sampler():
    sampler = ResumableLengthGroupedSampler(Tokens(50).lengths, 4, seed=1)
    assert isinstance(sampler, ResumableSampler)
    sampler.set_epoch(2)
    full = sampler.order(2).tolist()
    sampler.skip(13)
    assert list(sampler) == full[13:]
    assert list(sampler) == full  # skip applies to the next pass only
    assert len(sampler) == 50
    assert sampler.state_dict() == {"epoch": 2, "seed": 1, "num_samples": 50, "batch_size": 4}


def test_lengths_computed_once_by_index_without_iterating():
    data = Tokens(30)
    lengths = sample_lengths(data, "length", "input_ids")  # would loop forever with `for x in data`
    assert lengths == data.lengths and data.calls == 30


def test_lengths_from_a_length_column():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * 3, [1] * 5], "n_tokens": [30, 50]})
    assert sample_lengths(ds, "n_tokens", "input_ids") == [30, 50]
    assert sample_lengths([{"length": 4, "x": 1}], "length", "input_ids") == [4]


def test_missing_lengths_name_the_fix():
    with pytest.raises(ValueError, match="length_column_name"):
        sample_lengths(RegressionDataset(length=4), "length", "input_ids")


def _group_trainer(out_dir, data, seed=42, **kwargs):
    args = make_args(out_dir, train_sampling_strategy="group_by_length", per_device_train_batch_size=4,
                     num_train_epochs=2, seed=seed, **kwargs)
    return Trainer(model=TinyTokenLM(), args=args, train_dataset=data,
                   data_collator=_pad_collate)


def _pad_collate(features):
    width = max(len(f["input_ids"]) for f in features)
    pad = lambda t, v: torch.nn.functional.pad(t, (0, width - len(t)), value=v)
    return {"input_ids": torch.stack([pad(f["input_ids"], 0) for f in features]),
            "labels": torch.stack([pad(f["labels"], -100) for f in features])}


def test_trainer_group_by_length_sampler_seeded_by_data_seed(out_dir):
    data = Tokens(40)
    trainer = _group_trainer(out_dir, data, data_seed=5)
    loader = trainer.get_train_dataloader()
    sampler = TrainFeed.of(loader).sampler
    # a LengthGroupedSampler too, as the reference's Trainer's sampler is
    assert isinstance(sampler, ResumableLengthGroupedSampler) and isinstance(sampler, LengthGroupedSampler)
    assert sampler.seed == 5
    assert data.calls == 40  # lengths were computed once
    torch.manual_seed(999)  # consuming the global RNG does not change the order
    assert list(sampler) == list(ResumableLengthGroupedSampler(data.lengths, 4, seed=5))
    widths = [b["input_ids"].shape[1] for b in loader]
    assert widths[0] == max(data.lengths)


def test_trainer_trains_with_group_by_length_and_is_reproducible(out_dir):
    losses = []
    for _ in range(2):
        torch.manual_seed(0)
        trainer = _group_trainer(out_dir, Tokens(40), logging_steps=1)
        torch.manual_seed(0)  # model init draws from the global RNG; the data order must not
        trainer.model = trainer.model_wrapped = TinyTokenLM()
        trainer.train()
        losses.append([h["loss"] for h in trainer.state.log_history if "loss" in h])
    assert losses[0] == losses[1] and len(losses[0]) == 20


def test_sequential_and_random_strategies(out_dir):
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, train_sampling_strategy="sequential"),
                      train_dataset=RegressionDataset(length=10))
    assert list(TrainFeed.of(trainer.get_train_dataloader()).sampler) == list(range(10))
    trainer = Trainer(model=RegressionModel(), args=make_args(out_dir, seed=3),
                      train_dataset=RegressionDataset(length=10))
    sampler = TrainFeed.of(trainer.get_train_dataloader()).sampler
    assert sorted(sampler) == list(range(10)) and list(sampler) != list(range(10))


def test_resume_mid_epoch_with_group_by_length_is_exact(out_dir):
    def run(resume=None, **kwargs):
        torch.manual_seed(0)
        trainer = _group_trainer(out_dir, Tokens(40), logging_steps=1, save_strategy="steps", save_steps=13,
                                 learning_rate=0.1, **kwargs)
        trainer.train(resume_from_checkpoint=resume)
        losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, losses

    full_params, full_losses = run()
    resumed_params, resumed_losses = run(resume=f"{out_dir}/checkpoint-13")
    for name, value in full_params.items():
        assert torch.equal(value, resumed_params[name]), name
    assert all(resumed_losses[s] == full_losses[s] for s in resumed_losses if s > 13)


# --- the reference's public samplers (trainwell.trainer_pt_utils) --------------------------------------------------

LENGTHS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
# Observed on transformers 5.x: LengthGroupedSampler(2, ..., generator=torch.Generator().manual_seed(0)), and
# DistributedLengthGroupedSampler(2, lengths=LENGTHS, num_replicas=4, rank=r, seed=5) after set_epoch(1).
REFERENCE_ORDER = [12, 3, 7, 6, 11, 2, 10, 9, 4, 1, 5, 13, 8, 0]
REFERENCE_BY_TOKENS = [3, 4, 6, 7, 2, 11, 9, 10, 1, 12, 13, 5, 0, 8]
REFERENCE_RANKS = [[5, 8, 12, 10], [2, 0, 4, 6], [7, 13, 9, 5], [11, 3, 1, 2]]


def _samples():
    """Samples as dicts: input_ids of LENGTHS[i] tokens, and a 'tokens' entry of 10 - LENGTHS[i]."""
    return [{"input_ids": list(range(n)), "tokens": [0] * (10 - n)} for n in LENGTHS]


def _reference_pt_utils():
    transformers = pytest.importorskip("transformers")
    return transformers.trainer_pt_utils


def test_length_grouped_sampler_has_the_reference_constructor_and_order():
    seeded = lambda: torch.Generator().manual_seed(0)
    assert list(LengthGroupedSampler(2, lengths=LENGTHS, generator=seeded())) == REFERENCE_ORDER
    assert list(LengthGroupedSampler(2, lengths=torch.tensor(LENGTHS), generator=seeded())) == REFERENCE_ORDER
    by_dataset = LengthGroupedSampler(2, dataset=_samples(), generator=seeded())  # lengths read from input_ids
    assert by_dataset.lengths == LENGTHS and len(by_dataset) == len(LENGTHS)
    assert list(by_dataset) == REFERENCE_ORDER
    by_name = LengthGroupedSampler(2, _samples(), model_input_name="tokens", generator=seeded())
    assert list(by_name) == REFERENCE_BY_TOKENS
    # no generator: each pass draws from the global torch RNG, as the reference's does
    sampler = LengthGroupedSampler(2, lengths=LENGTHS)
    torch.manual_seed(1)
    first = list(sampler)
    torch.manual_seed(1)
    assert list(sampler) == first and sorted(first) == list(range(len(LENGTHS)))


def test_length_grouped_samplers_equal_the_reference_when_installed():
    ref = _reference_pt_utils()
    by_tokens = {"dataset": _samples(), "model_input_name": "tokens"}
    for kwargs in ({"lengths": LENGTHS}, {"dataset": _samples()}, by_tokens):
        ours = LengthGroupedSampler(3, generator=torch.Generator().manual_seed(4), **kwargs)
        theirs = ref.LengthGroupedSampler(3, generator=torch.Generator().manual_seed(4), **kwargs)
        assert [list(ours), list(ours)] == [list(theirs), list(theirs)], kwargs  # the generator advances alike
    for drop_last in (False, True):
        for rank in range(3):
            kwargs = {"num_replicas": 3, "rank": rank, "seed": 2, "drop_last": drop_last}
            ours = DistributedLengthGroupedSampler(2, _samples(), **kwargs)
            theirs = ref.DistributedLengthGroupedSampler(2, _samples(), **kwargs)
            for epoch in (0, 3):
                ours.set_epoch(epoch)
                theirs.set_epoch(epoch)
                assert list(ours) == list(theirs) and len(ours) == len(theirs), (drop_last, rank, epoch)


def test_distributed_length_grouped_sampler_deals_the_order_over_ranks():
    samplers = [DistributedLengthGroupedSampler(2, lengths=LENGTHS, num_replicas=4, rank=r, seed=5) for r in range(4)]
    for sampler in samplers:
        sampler.set_epoch(1)
    assert [list(s) for s in samplers] == REFERENCE_RANKS  # 14 samples padded to 16 from the order's start
    assert isinstance(samplers[0], torch.utils.data.DistributedSampler) and len(samplers[0]) == 4
    dropped = [DistributedLengthGroupedSampler(2, lengths=LENGTHS, num_replicas=4, rank=r, seed=5, drop_last=True)
               for r in range(4)]
    for sampler in dropped:
        sampler.set_epoch(1)
    assert [list(s) for s in dropped] == [ranks[:3] for ranks in REFERENCE_RANKS]
    # more processes than twice the samples: every rank still gets num_samples (the reference's assert fails)
    tiny = [list(DistributedLengthGroupedSampler(1, lengths=[2, 5], num_replicas=5, rank=r)) for r in range(5)]
    assert all(len(t) == 1 for t in tiny) and {i for t in tiny for i in t} == {0, 1}


def test_length_grouped_samplers_refuse_what_the_reference_refuses():
    for cls, extra in ((LengthGroupedSampler, {}), (DistributedLengthGroupedSampler, {"num_replicas": 2, "rank": 0})):
        with pytest.raises(ValueError, match="neither lengths= nor a dataset"):
            cls(4, **extra)
        with pytest.raises(ValueError, match=r"sample 0 has no 'input_ids' \(it has \['x', 'labels'\]\)"):
            cls(4, dataset=[{"x": 1, "labels": 0}], **extra)
        with pytest.raises(ValueError, match="sample 0 has no 'ids' .*model_input_name="):
            cls(4, dataset=_samples(), model_input_name="ids", **extra)
        with pytest.raises(ValueError, match=r"sample 0 has no 'input_ids' \(it has tuple\)"):
            cls(4, dataset=[(1, 2)], **extra)
    with pytest.raises(ValueError, match="torch.distributed, which is not initialized"):
        DistributedLengthGroupedSampler(4, lengths=LENGTHS)  # num_replicas and rank from a missing process group
    with pytest.raises(ValueError, match=r"rank in \[0, 1\]"):
        DistributedLengthGroupedSampler(4, lengths=LENGTHS, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="batch_size=0"):
        LengthGroupedSampler(0, lengths=LENGTHS)


def test_reference_errors_are_value_errors_too():
    ref = _reference_pt_utils()
    for call in (lambda: ref.LengthGroupedSampler(4), lambda: ref.LengthGroupedSampler(4, dataset=[{"x": 1}]),
                 lambda: ref.DistributedLengthGroupedSampler(4, num_replicas=2, rank=0),
                 lambda: ref.DistributedLengthGroupedSampler(4, dataset=[(1, 2)], num_replicas=2, rank=0),
                 lambda: ref.DistributedLengthGroupedSampler(4, lengths=LENGTHS)):  # no process group
        with pytest.raises(ValueError):
            call()
