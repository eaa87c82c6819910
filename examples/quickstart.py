"""Train, evaluate, save and use a small classifier; seconds on a CPU. Then: trainwell report quickstart-out"""

import numpy as np
import torch
from torch import nn

from trainwell import Trainer, TrainingArguments  # the one line that differs from a transformers script


def blobs(n, seed):  # points around 4 centres in 16-D; the label is the centre
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    centres = 2 * torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    return [{"x": x, "labels": y} for x, y in zip(centres[labels] + torch.randn(n, 16, generator=g), labels)]


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x, labels=None):  # the label names come from forward's signature
        out = {"logits": self.net(x)}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(out["logits"], labels)
        return out  # a dict, a tuple (loss first) or a dataclass


def accuracy(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, -1) == labels).mean())}


args = TrainingArguments(output_dir="quickstart-out", num_train_epochs=3, per_device_train_batch_size=32,
                         learning_rate=3e-3, eval_strategy="epoch", save_strategy="epoch", logging_steps=10,
                         report_to="none")  # fmt: skip
trainer = Trainer(model=Classifier(), args=args, train_dataset=blobs(2048, seed=1),
                  eval_dataset=blobs(512, seed=2), compute_metrics=accuracy)  # fmt: skip
trainer.train()  # train(resume_from_checkpoint=True) goes on from the newest complete checkpoint
print(trainer.evaluate())  # {'eval_loss': ..., 'eval_accuracy': ..., 'eval_runtime': ..., 'epoch': 3.0}
trainer.save_model()  # quickstart-out/model.safetensors and training_args.json
print("predicted:", trainer.predict(blobs(8, seed=3)).predictions.argmax(-1))
