"""One training run on Ray Train's workers, or the same run under torchrun, for tests/test_ray_train.py.

:func:`train_func` is what ``ray.train.torch.TorchTrainer`` runs on each worker; run as a script (under
``torchrun --nproc_per_node 2``) it trains the same run with no Ray at all. The run: the tiny dropout MLP of
tests/common/models.py (its randomness makes an inexact RNG restore visible), 6 steps, a checkpoint every 2.
``engine`` picks how Ray is told about checkpoints and how a restarted worker resumes:

- ``"trainwell"``: ``trainwell.integrations.ray.RayTrainReportCallback``, ``resume_from_checkpoint=
  latest_checkpoint()``;
- ``"reference"``: what the reference's users write (Ray's ``RayTrainReportCallback`` and ``prepare_trainer``
  from ``ray.train.huggingface.transformers``, and Ray's documented resume from ``ray.train.get_checkpoint()``);
- ``"torchrun"``: neither (the script's own mode).

Each process writes ``rank{RANK}.json`` into ``report_dir`` when it ends: its final weights and logged losses, the
checkpoint it resumed, and every ``ray.train.report`` call it made (recorded by wrapping the function). With
``kill_step``, process ``kill_rank`` exits with ``os._exit`` at the end of that step, once (a marker file in
``report_dir`` keeps the restarted process alive), after Ray has registered the checkpoints reported so far
(``wait_for_registration=False``: at once, so Ray may not have registered the newest one yet).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

STEPS, SAVE_STEPS = 6, 2


def train_func(config: dict) -> None:
    """Train once on this process (a Ray Train worker, or a torchrun process); see the module docstring."""
    import torch

    import trainwell
    from tests.common.models import ClassificationDataset, DropoutMLP
    from trainwell import Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)  # the same kernels under Ray and torchrun, whatever each sets OMP_NUM_THREADS to
    rank, engine, report_dir = int(os.environ["RANK"]), config["engine"], config["report_dir"]
    marker = os.path.join(report_dir, "killed")
    report: dict = {"rank": rank, "trainwell": trainwell.__file__, "attempt": 1 + os.path.exists(marker),
                    "reports": []}
    if engine != "torchrun":
        _record_reports(report["reports"])

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if rank == config.get("kill_rank") and state.global_step == config.get("kill_step") \
                    and not os.path.exists(marker):
                open(marker, "w").close()
                if engine != "torchrun" and config.get("wait_for_registration", True):
                    _wait_until_ray_registered_the_reports()
                os._exit(1)  # no clean-up, no exception: as a worker lost to a crash

    output_dir = config["output_dir"].format(rank=rank)  # "{rank}" in it: a disk per process, none shared
    args = TrainingArguments(
        output_dir=output_dir, use_cpu=True, report_to="none", disable_tqdm=True, max_steps=STEPS,
        per_device_train_batch_size=4, learning_rate=0.05, save_strategy="steps", save_steps=SAVE_STEPS,
        logging_steps=1,
    )
    torch.manual_seed(0)
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=ClassificationDataset(n=64), callbacks=[Kill()])
    if engine == "trainwell":
        from trainwell.integrations.ray import RayTrainReportCallback, latest_checkpoint

        trainer.add_callback(RayTrainReportCallback())
        report["resumed"] = latest_checkpoint()
        trainer.train(resume_from_checkpoint=report["resumed"])
    elif engine == "reference":
        _train_as_the_reference_users_do(trainer, report)
    else:
        trainer.train()
    report.update(
        step=trainer.state.global_step,
        params={n: p.detach().flatten().tolist() for n, p in trainer.model.named_parameters()},
        losses=[h["loss"] for h in trainer.state.log_history if "loss" in h],
        trainer_class=type(trainer).__name__,
    )
    with open(os.path.join(report_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(report, fh)


def _train_as_the_reference_users_do(trainer, report: dict) -> None:
    """Ray's guide for the reference's Trainer, with trainwell's Trainer in its place."""
    import ray.train
    from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    report["prepared_class"] = type(trainer).__name__
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            report["resumed"] = os.path.join(checkpoint_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.train(resume_from_checkpoint=report["resumed"])
    else:
        report["resumed"] = None
        trainer.train()
    report["ray_data"] = _train_on_a_ray_data_shard(prepare_trainer, trainer.args.output_dir + "-ray-data")


def _train_on_a_ray_data_shard(prepare_trainer, output_dir: str) -> dict:
    """prepare_trainer's other half: this worker's shard of the run's Ray Dataset as the ``train_dataset``."""
    import ray.train

    from tests.common.models import DropoutMLP
    from trainwell import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=output_dir, use_cpu=True, report_to="none", disable_tqdm=True, max_steps=2,
                             logging_steps=1, save_strategy="no")
    batches = ray.train.get_dataset_shard("train").iter_torch_batches(batch_size=4)
    trainer = prepare_trainer(Trainer(model=DropoutMLP(), args=args, train_dataset=batches))
    trainer.train()
    return {"step": trainer.state.global_step, "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "dataset": type(trainer.get_train_dataloader().dataset).__name__,
            "params": {n: p.detach().flatten().tolist() for n, p in trainer.model.named_parameters()}}


def _wait_until_ray_registered_the_reports() -> None:
    """Ray registers a checkpoint once every worker's report of it has reached the controller, which polls them; a
    worker that dies just after a report can leave it unregistered, and the restart then resumes the checkpoint
    before (exactly too). Waiting here makes the test's restart resume the newest one, every time."""
    import ray.train

    ray.train.get_all_reported_checkpoints(consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED)


def _record_reports(calls: list) -> None:
    """Wrap ``ray.train.report`` (both callbacks look it up when they call it): who reported what."""
    import ray.train

    inner = ray.train.report

    def report(metrics, checkpoint=None, **kwargs):
        files = None
        if checkpoint is not None:
            files = sorted(os.path.relpath(os.path.join(d, f), checkpoint.path)
                           for d, _, names in os.walk(checkpoint.path) for f in names)
        calls.append({"step": metrics.get("step"), "metrics": metrics, "files": files})
        return inner(metrics, checkpoint=checkpoint, **kwargs)

    ray.train.report = report


if __name__ == "__main__":  # under torchrun: the same run without Ray
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="where process 0's report is copied (tests.common.launch)")
    parser.add_argument("--workdir", required=True)
    cli = parser.parse_args()
    os.makedirs(cli.workdir, exist_ok=True)
    train_func({"engine": "torchrun", "report_dir": cli.workdir, "output_dir": os.path.join(cli.workdir, "out")})
    if os.environ["RANK"] == "0":
        with open(os.path.join(cli.workdir, "rank0.json")) as src, open(cli.out, "w") as dst:
            dst.write(src.read())
