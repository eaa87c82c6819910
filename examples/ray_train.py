"""Train on Ray Train: 2 CPU workers of a local Ray instance (or those of a cluster), checkpoints kept by Ray, and a
restarted worker resuming Ray's last one. python examples/ray_train.py [--workers N] [--gpu] [--address auto]"""

import argparse
import os

import ray
import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn

from trainwell import Trainer, TrainingArguments
from trainwell.integrations.ray import RayTrainReportCallback, latest_checkpoint


def blobs(n, seed):  # points around 4 centres in 16-D; the label is the centre
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    centres = 2 * torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    return [{"x": x, "labels": y} for x, y in zip(centres[labels] + torch.randn(n, 16, generator=g), labels)]


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}


def train_func(config):  # runs on every worker; Ray has set up their process group, the Trainer joins it
    args = TrainingArguments(output_dir=config["output_dir"], max_steps=config["steps"], learning_rate=3e-3,
                             per_device_train_batch_size=32, logging_steps=10, save_strategy="steps",
                             save_steps=20, report_to="none", use_cpu=not config["gpu"])  # fmt: skip
    trainer = Trainer(model=Classifier(), args=args, train_dataset=blobs(2048, seed=1),
                      callbacks=[RayTrainReportCallback()])  # fmt: skip
    # None on the first start (train from scratch); after Ray restarted the workers, its last checkpoint
    trainer.train(resume_from_checkpoint=latest_checkpoint())


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2, help="training processes (one per GPU with --gpu)")
    parser.add_argument("--gpu", action="store_true", help="one GPU per worker")
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),  # set by `ray job submit`
                        help="a running cluster ('auto': the one `ray start` began on this node)")
    parser.add_argument("--storage", default=os.path.abspath("ray-results"), help="Ray's checkpoints: a folder every "
                        "node reaches (a shared disk) or s3://bucket/prefix")  # fmt: skip
    parser.add_argument("--steps", type=int, default=60)
    cli = parser.parse_args()
    if cli.address:  # a running cluster; its dashboard is `ray start`'s choice (--include-dashboard)
        ray.init(address=cli.address)
    else:  # a Ray of its own, without the dashboard, whose start can time out Ray's on a busy machine
        ray.init(address="local", num_cpus=cli.workers, include_dashboard=False)
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"output_dir": os.path.abspath("ray-train-out"), "steps": cli.steps, "gpu": cli.gpu},
        scaling_config=ScalingConfig(num_workers=cli.workers, use_gpu=cli.gpu),
        run_config=RunConfig(
            name="ray-train-example",
            storage_path=cli.storage,
            failure_config=FailureConfig(max_failures=2),  # restart the workers up to twice
            checkpoint_config=CheckpointConfig(num_to_keep=2),
        ),
    )
    result = trainer.fit()  # a second fit() with the same name and storage continues from Ray's last checkpoint
    print("step", result.metrics["step"], "loss", round(result.metrics["loss"], 4))
    print("checkpoint:", os.path.join(result.checkpoint.path, "checkpoint"))  # a trainwell checkpoint-N folder


if __name__ == "__main__":
    main()
