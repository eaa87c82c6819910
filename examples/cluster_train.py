"""A training script shaped for a cluster (docs/scaling.md, "On a cluster"): TrainingArguments from the command line,
and every start resumes the newest checkpoint in output_dir, so torchrun's restarts and a requeued job go on where
the last one stopped. Put your model and data in place of the toy ones. Run under torchrun or alone:
python examples/cluster_train.py --output_dir run --max_steps 200 --save_steps 50 --enable_jit_checkpoint"""

import os

import torch
from torch import nn

from trainwell import HfArgumentParser, Trainer, TrainingArguments
from trainwell.trainer_utils import get_last_checkpoint


def blobs(n, seed):  # points around 4 centres in 16-D; the label is the centre
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    centres = 2 * torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    return [{"x": x, "labels": y} for x, y in zip(centres[labels] + torch.randn(n, 16, generator=g), labels)]


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}


(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
torch.manual_seed(args.seed)
trainer = Trainer(model=Classifier(), args=args, train_dataset=blobs(4096, seed=1))
# None on the first start; after a restart (torchrun --max-restarts, a requeued job) the newest checkpoint
last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
trainer.train(resume_from_checkpoint=last)
