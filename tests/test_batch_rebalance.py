"""train_sampling_strategy="batch_rebalance": BatchRebalanceSampler's order (the reference's), balance, resume."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import Dataset

import trainwell.data.rebalance as rebalance
from tests.common.models import TinyTokenLM
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.data import loaders
from trainwell.data.rebalance import BatchRebalanceSampler, micro_batch_cost, step_micro_batches
from trainwell.data.train_loader import TrainFeed

# (number of samples, samples per step over all ranks, dp_size, grad_accum, drop_last)
CASES = [
    (50, 8, 1, 1, True),
    (50, 8, 1, 2, False),
    (97, 12, 2, 2, True),
    (97, 12, 2, 3, False),
    (64, 16, 4, 2, False),
    (13, 12, 3, 2, False),  # a tail of one sample padded up to six micro-batches
    (5, 4, 2, 2, False),
]


def _lengths(n: int, seed: int = 0, kind: str = "mixed") -> list[int]:
    rng = random.Random(seed)
    if kind == "ties":
        return [rng.choice([4, 16, 300]) for _ in range(n)]
    return [max(1, int(rng.paretovariate(1.3) * 12)) for _ in range(n)]


def _sampler(lengths, eff, dp, ga, drop, rank=0, **kwargs) -> BatchRebalanceSampler:
    return BatchRebalanceSampler(lengths, effective_batch_size=eff, dp_size=dp, grad_accum=ga, rank=rank,
                                 drop_last=drop, **kwargs)


@pytest.mark.parametrize("kind", ["mixed", "ties"])
@pytest.mark.parametrize(("n", "eff", "dp", "ga", "drop"), CASES)
def test_order_equals_the_references(n, eff, dp, ga, drop, kind):
    reference = pytest.importorskip("transformers.trainer_pt_utils").BatchRebalanceSampler
    lengths = _lengths(n, seed=n, kind=kind)
    for rank in range(dp):
        for seed in (42, 7):
            kwargs = dict(lengths=lengths, effective_batch_size=eff, dp_size=dp, grad_accum=ga, rank=rank,
                          drop_last=drop, seed=seed)
            theirs, ours = reference(**kwargs), BatchRebalanceSampler(**kwargs)
            assert len(ours) == len(theirs)
            for epoch in (0, 1):
                theirs.set_epoch(epoch)
                ours.set_epoch(epoch)
                expected = list(theirs)
                assert list(ours) == expected == ours.order(epoch)
                assert len(expected) == len(ours)


def test_unshuffled_order_equals_the_references():
    reference = pytest.importorskip("transformers.trainer_pt_utils").BatchRebalanceSampler
    kwargs = dict(lengths=_lengths(40), effective_batch_size=8, dp_size=2, grad_accum=2, shuffle=False, rank=1)
    assert list(BatchRebalanceSampler(**kwargs)) == list(reference(**kwargs))


def test_each_step_is_cost_balanced():
    rng = random.Random(3)
    for _ in range(300):
        dp, ga = rng.randint(1, 4), rng.randint(1, 4)
        k = dp * ga
        n = k * rng.randint(1, 6) + rng.randint(0, k - 1)
        lengths = [rng.randint(1, 400) for _ in range(n)]
        per_rank = step_micro_batches(list(range(n)), lengths, dp, ga, max_moves=max(30 * k, n))
        batches = [mb for rank in per_rank for mb in rank]
        assert sorted(i for mb in batches for i in mb) == list(range(n)) and all(batches)
        cost = {id(mb): micro_batch_cost(len(mb), max(lengths[i] for i in mb)) for mb in batches}
        # padding-minimal: a micro-batch is a run of the step's samples sorted by length
        runs = sorted(batches, key=lambda mb: (max(lengths[i] for i in mb), min(lengths[i] for i in mb)), reverse=True)
        assert all(min(lengths[i] for i in a) >= max(lengths[i] for i in b) for a, b in zip(runs, runs[1:]))
        # slot s runs the dp_size most expensive micro-batches left: ranks in one slot wait little on each other
        slots = [[cost[id(per_rank[r][s])] for r in range(dp)] for s in range(ga)]
        assert all(min(a) >= max(b) for a, b in zip(slots, slots[1:]))
        # never less even than cutting the sorted samples into equal-size micro-batches
        longest_first = sorted(lengths, reverse=True)
        sizes = [n // k + (i < n % k) for i in range(k)]
        starts = [sum(sizes[:g]) for g in range(k)]
        equal = [micro_batch_cost(sizes[g], longest_first[starts[g]]) for g in range(k)]
        assert max(cost.values()) - min(cost.values()) <= max(equal) - min(equal)


def test_balancing_puts_fewer_long_samples_in_a_micro_batch():
    lengths = [500] * 4 + [10] * 60
    (batches,) = step_micro_batches(list(range(64)), lengths, dp_size=1, grad_accum=4, max_moves=120)
    sizes = {max(lengths[i] for i in mb): len(mb) for mb in batches}
    assert sizes[500] < 16 < sizes[10]


@pytest.mark.parametrize(("n", "eff", "dp", "ga", "drop"), CASES)
def test_every_index_once_per_epoch_across_ranks(n, eff, dp, ga, drop):
    lengths = _lengths(n, seed=1)
    samplers = [_sampler(lengths, eff, dp, ga, drop, rank=r, seed=3) for r in range(dp)]
    for epoch in (0, 1):
        seen = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            seen += [i for mb in sampler for i in mb]
        assert len({len(s) for s in samplers}) == 1  # every rank runs as many micro-batches
        kept = n - n % eff if drop else n
        permutation = torch.randperm(n, generator=torch.Generator().manual_seed(3 + epoch)).tolist()
        assert sorted(set(seen)) == sorted(permutation[:kept])
        padding = max(0, dp * ga - n % eff) if not drop and n % eff else 0
        assert len(seen) == kept + padding  # duplicates only pad a tail smaller than dp_size x grad_accum


def test_order_is_a_function_of_seed_and_epoch_only():
    lengths = _lengths(60)
    a, b = _sampler(lengths, 8, 2, 2, True, seed=5), _sampler(lengths, 8, 2, 2, True, seed=5)
    torch.manual_seed(0)
    first = list(a)
    torch.manual_seed(123)  # the global RNG plays no part, and is not consumed
    state = torch.random.get_rng_state()
    assert list(b) == first
    assert torch.equal(state, torch.random.get_rng_state())
    a.set_epoch(1)
    assert list(a) != first and list(a) == a.order(1)
    assert list(_sampler(lengths, 8, 2, 2, True, seed=6)) != first


def test_skip_then_iterate_resumes_mid_epoch():
    sampler = _sampler(_lengths(97), 12, 2, 3, False, rank=1, seed=9)
    assert len(sampler) == 9 * 3  # 8 full steps and the kept tail, three micro-batches each
    sampler.set_epoch(2)
    full = sampler.order(2)
    for k in (0, 1, 4, 9, 26, 27, 40):
        sampler.skip(k)
        assert list(sampler) == full[k:]
    assert list(sampler) == full  # skip applies to the next pass only
    assert len(sampler) == 27  # len is always the full epoch
    assert sampler.state_dict() == {"epoch": 2, "seed": 9, "num_samples": 97, "effective_batch_size": 12,
                                    "dp_size": 2, "grad_accum": 3, "rank": 1, "drop_last": False}
    with pytest.raises(ValueError, match="skip"):
        sampler.skip(-1)


def test_skip_balances_none_of_the_skipped_steps(monkeypatch):
    calls = []
    real = rebalance.step_micro_batches
    monkeypatch.setattr(rebalance, "step_micro_batches", lambda *a, **k: calls.append(1) or real(*a, **k))
    sampler = _sampler(_lengths(96), 8, 1, 2, True)
    sampler.skip(17)  # into step 8 of 12
    assert len(list(sampler)) == 24 - 17 and len(calls) == 12 - 8


def test_iter_reads_epoch_and_skip_when_called():
    sampler = _sampler(_lengths(40), 8, 1, 2, True)
    sampler.skip(3)
    iterator = iter(sampler)
    sampler.set_epoch(1)
    assert list(iterator) == sampler.order(0)[3:]
    assert list(sampler) == sampler.order(1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(effective_batch_size=3, dp_size=2, grad_accum=2), "smaller than dp_size x grad_accum"),
        (dict(effective_batch_size=8, dp_size=0, grad_accum=2), "dp_size"),
        (dict(effective_batch_size=8, dp_size=2, grad_accum=2, rank=2), "rank"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BatchRebalanceSampler([3] * 10, **kwargs)


class TokenLists(Dataset):
    """Unpadded token sequences of lengths 1..24 (seeded), each knowing its own index."""

    def __init__(self, n: int = 40, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.lengths = torch.randint(1, 25, (n,), generator=g).tolist()

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        ids = (torch.arange(self.lengths[i]) * (i + 1)) % 16 + 1
        return {"input_ids": ids, "labels": ids % 5, "index": i}


class PadCollator:
    """Pads to the longest sequence of the batch and records which samples each batch held."""

    def __init__(self):
        self.seen: list[list[int]] = []

    def __call__(self, features):
        self.seen.append([f["index"] for f in features])
        width = max(len(f["input_ids"]) for f in features)
        pad = lambda t, v: torch.nn.functional.pad(t, (0, width - len(t)), value=v)  # noqa: E731
        return {"input_ids": torch.stack([pad(f["input_ids"], 0) for f in features]),
                "labels": torch.stack([pad(f["labels"], -100) for f in features])}


def test_train_sampler_reads_world_rank_and_accumulation_from_args():
    args = SimpleNamespace(train_sampling_strategy="batch_rebalance", data_seed=None, seed=11, world_size=2,
                           process_index=1, gradient_accumulation_steps=3, dataloader_drop_last=True,
                           length_column_name="length")
    sampler = loaders.train_sampler(TokenLists(30), args, batch_size=2 * 3)
    assert isinstance(sampler, BatchRebalanceSampler)
    assert (sampler.effective_batch_size, sampler.dp_size, sampler.grad_accum, sampler.rank) == (12, 2, 3, 1)
    assert (sampler.seed, sampler.drop_last, sampler.lengths) == (11, True, TokenLists(30).lengths)
    with pytest.raises(NotImplementedError, match="'batch_rebalance'"):
        loaders.train_sampler(TokenLists(30), SimpleNamespace(**{**vars(args), "train_sampling_strategy": "bogus"}))


def _trainer(out_dir, data, collator, **kwargs):
    args = make_args(out_dir, train_sampling_strategy="batch_rebalance", per_device_train_batch_size=4,
                     gradient_accumulation_steps=2, num_train_epochs=2, remove_unused_columns=False,
                     logging_steps=1, **kwargs)
    return Trainer(model=TinyTokenLM(), args=args, train_dataset=data, data_collator=collator)


def test_trainer_trains_on_the_samplers_micro_batches(out_dir):
    data, collator = TokenLists(40), PadCollator()
    trainer = _trainer(out_dir, data, collator)
    loader = trainer.get_train_dataloader()
    sampler = TrainFeed.of(loader).sampler
    assert isinstance(sampler, BatchRebalanceSampler) and sampler.seed == 42 and len(loader) == 10
    assert sampler.effective_batch_size == 8 and sampler.grad_accum == 2 and sampler.dp_size == 1
    collator.seen.clear()
    trainer.train()
    assert collator.seen == sampler.order(0) + sampler.order(1)
    assert trainer.state.global_step == 10
    assert len([h for h in trainer.state.log_history if "loss" in h]) == 10
    reference = pytest.importorskip("transformers.trainer_pt_utils").BatchRebalanceSampler
    # the reference's Trainer builds its sampler with the sampler's default seed (42) and drop_last from args
    theirs = reference(lengths=data.lengths, effective_batch_size=8, dp_size=1, grad_accum=2, drop_last=False)
    assert collator.seen[:10] == list(theirs)


def test_trainer_resumes_mid_epoch_on_the_same_micro_batches(out_dir):
    def run(resume=None):
        torch.manual_seed(0)
        collator = PadCollator()
        trainer = _trainer(out_dir, TokenLists(36), collator, save_strategy="steps", save_steps=3,
                           learning_rate=0.1)
        collator.seen.clear()
        trainer.train(resume_from_checkpoint=resume)
        params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        return params, collator.seen

    full_params, full_seen = run()
    resumed_params, resumed_seen = run(resume=f"{out_dir}/checkpoint-3")
    assert resumed_seen == full_seen[6:]  # 3 steps x 2 micro-batches were done before the checkpoint
    for name, value in full_params.items():
        assert torch.equal(value, resumed_params[name]), name


def test_accelerate_sharding_is_undone_for_rank_batches():
    data_loader = pytest.importorskip("accelerate.data_loader")
    sampler = _sampler(_lengths(12), 8, 2, 2, False, rank=1)
    loader = loaders.DataLoader(list(range(12)), batch_sampler=sampler, collate_fn=list)
    prepared = data_loader.prepare_data_loader(loader, num_processes=2, process_index=1, put_on_device=False)
    assert len(list(prepared)) < len(sampler)  # Accelerate alone shards the rank's micro-batches a second time
    assert rebalance.keep_rank_batches(prepared, sampler) is prepared
    assert list(prepared) == sampler.order(0) and len(prepared) == len(sampler)
    plain = loaders.DataLoader(list(range(12)), batch_size=2)
    assert rebalance.keep_rank_batches(plain, plain.sampler) is plain  # other samplers: untouched
