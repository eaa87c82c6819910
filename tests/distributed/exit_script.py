"""Exits right after its last collective, holding the process group: the pattern that made gloo abort.

Each rank builds a Trainer (which starts the gloo group through Accelerate), runs collectives on tensors
that Python owns, keeps a reference to the group (as a DDP wrapper does), waits at a barrier, ends the
Trainer and exits at once. Without trainwell's exit hook 4 of 15 such runs died with SIGABRT
("terminate called without an active exception") after the script had finished.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from tests.common.models import RegressionModel  # noqa: E402
from trainwell import Trainer, TrainingArguments  # noqa: E402

with tempfile.TemporaryDirectory() as out:
    trainer = Trainer(model=RegressionModel(), args=TrainingArguments(output_dir=out, report_to="none",
                                                                      use_cpu=True, disable_tqdm=True))
assert trainer.runtime.num_processes == 2, "launch with 2 processes"
held = dist.group.WORLD
values = torch.ones(1000)
for _ in range(20):
    dist.all_reduce(values)
trainer.runtime.wait_for_everyone()
trainer.end()
