"""A training loader that a subclass builds itself (``get_train_dataloader`` overridden, as sentence-transformers
does), or a sampler it returns from ``_get_train_sampler`` (torch's, or TRL's): the reference's sample order in every
epoch, and a resume that continues it without loading what it skips.

The reference's Accelerator swaps a loader's torch ``RandomSampler`` for its seedable sampler, which ``set_epoch``
reseeds with seed + epoch, and its epoch loop reaches a batch sampler that Accelerate wrapped; on a resume it skips
the consumed batches at the batch sampler (Accelerate's ``skip_first_batches``). Each test runs the reference
in-process next to trainwell.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from tests.common.models import ClassificationDataset, DropoutMLP
from trainwell import TrainerCallback

transformers = pytest.importorskip("transformers")
import trainwell  # noqa: E402

EPOCHS, BATCH, SAMPLES = 3, 16, 96  # 6 steps an epoch


class CountingData(ClassificationDataset):
    """Counts the samples loaded (a resume must not load the ones it skips)."""

    def __init__(self) -> None:
        super().__init__(n=SAMPLES)
        self.loaded = 0

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.loaded += 1
        return super().__getitem__(i)


class EpochBatches:
    """An epoch-seeded batch sampler (sentence-transformers' kind): its order depends on ``set_epoch`` only."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(100 + self.epoch)).tolist()
        return iter([order[i:i + BATCH] for i in range(0, self.n, BATCH)])

    def __len__(self) -> int:
        return self.n // BATCH


class Wrapped:
    """A batch sampler wrapping another without forwarding ``set_epoch`` (as Accelerate's shard does)."""

    def __init__(self, inner: EpochBatches) -> None:
        self.batch_sampler = inner

    def __iter__(self):
        return iter(self.batch_sampler)

    def __len__(self) -> int:
        return len(self.batch_sampler)


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = control.should_training_stop = True


def run(lib, tmp_path, name: str, loader: str, resume: str | None = None, stop: int | None = None) -> dict:
    class OwnLoaderTrainer(lib.Trainer):
        def _get_train_sampler(self, train_dataset=None):
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            if loader == "random-sampler":
                return RandomSampler(dataset)
            if loader == "sequential-sampler":
                return SequentialSampler(dataset)
            return super()._get_train_sampler(train_dataset)

        def get_train_dataloader(self):
            if loader.endswith("-sampler"):
                return super().get_train_dataloader()
            if loader == "shuffled":  # sentence-transformers' kind: a seeded RandomSampler, the loader without a
                # generator (each pass draws its worker seed from the global RNG, which dropout then continues)
                sampler = RandomSampler(self.train_dataset, generator=torch.Generator().manual_seed(self.args.seed))
                return self.accelerator.prepare(DataLoader(self.train_dataset, batch_size=BATCH, sampler=sampler,
                                                           collate_fn=self.data_collator))
            return DataLoader(self.train_dataset, batch_sampler=Wrapped(EpochBatches(SAMPLES)),
                              collate_fn=self.data_collator)

        def compute_loss(self, model, inputs, *args, **kwargs):
            self.order.append(inputs["x"][:, 0].tolist())
            return super().compute_loss(model, inputs, *args, **kwargs)

    lib.set_seed(0)
    model, data = DropoutMLP(), CountingData()
    args = lib.TrainingArguments(str(tmp_path / name), report_to="none", use_cpu=True, disable_tqdm=True,
                                 num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH, logging_steps=1,
                                 save_strategy="no", seed=0)
    trainer = OwnLoaderTrainer(model=model, args=args, train_dataset=data,
                               callbacks=[StopAt(stop)] if stop else [])
    trainer.order = []
    trainer.train(resume_from_checkpoint=resume)
    return {"order": trainer.order, "loaded": data.loaded,
            "losses": [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h],
            "weights": [p.detach().clone() for p in model.parameters()]}


def assert_same_run(mine: dict, theirs: dict) -> None:
    assert mine["order"] == theirs["order"]
    assert mine["losses"] == theirs["losses"]
    assert all(torch.equal(a, b) for a, b in zip(mine["weights"], theirs["weights"], strict=True))


@pytest.fixture(scope="module")
def shuffled(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("shuffled")
    return {lib.__name__: run(lib, tmp, lib.__name__, "shuffled") for lib in (trainwell, transformers)}


def test_a_shuffled_loader_of_a_subclass_draws_the_references_order_in_every_epoch(shuffled):
    mine, theirs = shuffled["trainwell"], shuffled["transformers"]
    assert len(mine["order"]) == EPOCHS * SAMPLES // BATCH
    epochs = [mine["order"][i:i + 6] for i in range(0, 18, 6)]
    assert epochs[0] != epochs[1] != epochs[2]  # a new order each epoch
    assert_same_run(mine, theirs)


def test_a_resume_in_the_second_epoch_continues_the_order_without_loading_what_it_skips(shuffled, tmp_path):
    run(trainwell, tmp_path, "run", "shuffled", stop=8)  # saves checkpoint-8: two steps into the second epoch
    resumed = run(trainwell, tmp_path, "run", "shuffled", resume=str(tmp_path / "run" / "checkpoint-8"))
    whole = shuffled["trainwell"]
    assert resumed["order"] == whole["order"][8:]
    assert resumed["losses"] == whole["losses"]  # the first 8 from the checkpoint's log history
    assert all(torch.equal(a, b) for a, b in zip(resumed["weights"], whole["weights"], strict=True))
    assert resumed["loaded"] == (EPOCHS * SAMPLES) - 8 * BATCH  # the skipped batches' indices only


def test_an_epoch_seeded_batch_sampler_wrapped_in_another_gets_each_epoch_as_on_the_reference(tmp_path):
    mine, theirs = (run(lib, tmp_path, lib.__name__, "wrapped") for lib in (trainwell, transformers))
    assert mine["order"][:6] != mine["order"][6:12]
    assert_same_run(mine, theirs)


@pytest.mark.parametrize("sampler", ["random-sampler", "sequential-sampler"])
def test_a_torch_sampler_from_get_train_sampler_gives_the_references_order_and_resumes(sampler, tmp_path):
    """Not trainwell's resumable sampler (no skip(), maybe no set_epoch()): the reference's loader for it."""
    mine, theirs = (run(lib, tmp_path, lib.__name__, sampler) for lib in (trainwell, transformers))
    assert_same_run(mine, theirs)
    run(trainwell, tmp_path, "run", sampler, stop=8)
    resumed = run(trainwell, tmp_path, "run", sampler, resume=str(tmp_path / "run" / "checkpoint-8"))
    assert resumed["order"] == mine["order"][8:] and resumed["losses"] == mine["losses"]
    assert all(torch.equal(a, b) for a, b in zip(resumed["weights"], mine["weights"], strict=True))


class Reversed(torch.utils.data.Sampler):
    def __init__(self, dataset) -> None:
        self.n = len(dataset)

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


def test_the_references_get_dataloader_and_get_eval_sampler_as_trls_grpo_uses_them(tmp_path):
    """TRL's GRPO and RLOO trainers build their loaders with the reference's ``_get_dataloader`` (a larger batch,
    their own samplers from ``_get_train_sampler`` / ``_get_eval_sampler``): same batches and predictions."""

    def run_with(lib):
        class GenerationBatches(lib.Trainer):
            def get_train_dataloader(self):
                return self._get_dataloader(dataset=self.train_dataset, description="Training",
                                            batch_size=self._train_batch_size * 2, sampler_fn=self._get_train_sampler,
                                            is_training=True)

            def _get_train_sampler(self, dataset=None):
                return RandomSampler(dataset, generator=torch.Generator().manual_seed(self.args.seed))

            def _get_eval_sampler(self, eval_dataset):
                return Reversed(eval_dataset)

            def compute_loss(self, model, inputs, *args, **kwargs):
                if model.training:
                    self.order.append(inputs["x"][:, 0].tolist())
                return super().compute_loss(model, inputs, *args, **kwargs)

        lib.set_seed(0)
        args = lib.TrainingArguments(str(tmp_path / lib.__name__), report_to="none", use_cpu=True, disable_tqdm=True,
                                     num_train_epochs=2, per_device_train_batch_size=8, save_strategy="no", seed=0,
                                     per_device_eval_batch_size=5)
        trainer = GenerationBatches(model=DropoutMLP(), args=args, train_dataset=CountingData(),
                                    eval_dataset=ClassificationDataset(n=12, seed=1))
        trainer.order = []
        trainer.train()
        return trainer.order, trainer.predict(ClassificationDataset(n=12, seed=1)).predictions

    (mine, my_predictions), (theirs, their_predictions) = run_with(trainwell), run_with(transformers)
    assert len(mine) == 2 * SAMPLES // 16 and mine == theirs
    assert my_predictions.tolist() == their_predictions.tolist()  # in the reversed order the sampler gave
