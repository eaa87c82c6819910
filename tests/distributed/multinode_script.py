"""One process of a simulated multi-node run, for tests/test_multinode.py (and benchmarks/reliability_multinode.py).

Started by ``torchrun --nnodes 2 --nproc_per_node N --rdzv_backend c10d`` once per "node", each from its own working
directory (two "disks") or both from one (a shared disk); ``output_dir`` is relative, so it lands on the node's disk.
Trains a dropout MLP (its randomness makes an inexact RNG restore visible) and writes ``rank{RANK}.json`` into
``--report``: the process's topology as the Trainer sees it, the log level it got, the files it wrote under its
working directory (from an audit hook: opens for writing, renames, removals; safetensors' own writer is wrapped,
as it writes from Rust), its final weights and logged losses, and its error if it failed. Its stdout and stderr go
to ``rank{RANK}.log`` there. ``--lib transformers`` runs the reference instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

parser = argparse.ArgumentParser()
parser.add_argument("--report", required=True, help="folder for rank{RANK}.json and rank{RANK}.log (absolute)")
parser.add_argument("--lib", choices=("trainwell", "transformers"), default="trainwell")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--save-steps", type=int, default=2)
parser.add_argument("--each", action="store_true", help="save_on_each_node=True")
parser.add_argument("--log-each", type=int, default=1, help="log_on_each_node")
parser.add_argument("--no-use-cpu", action="store_true", help="use_cpu=False (the default a GPU script has)")
parser.add_argument("--kill-rank", type=int, default=-1, help="this process SIGKILLs itself at the end of --kill-step")
parser.add_argument("--kill-step", type=int, default=0)
parser.add_argument("--resume", action="store_true", help="resume_from_checkpoint=True")
parser.add_argument("--resume-last", action="store_true",
                    help="resume_from_checkpoint=get_last_checkpoint(output_dir): None on the first run")
parser.add_argument("--find-unused", action="store_true", help="ddp_find_unused_parameters=True")
cli = parser.parse_args()
RANK = int(os.environ["RANK"])
os.makedirs(cli.report, exist_ok=True)
# a process torchrun restarted (--max-restarts) appends to its predecessor's log
_kept = os.O_APPEND if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) else os.O_TRUNC
_log = os.open(os.path.join(cli.report, f"rank{RANK}.log"), os.O_WRONLY | os.O_CREAT | _kept)
os.dup2(_log, 1)  # this process's prints, logs and tracebacks, apart from the other processes'
os.dup2(_log, 2)
logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")

HERE = os.getcwd()
WRITES: list[list[str]] = []  # [what, path relative to the working directory]


def _record(what: str, path: object) -> None:
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if isinstance(path, str):
        full = os.path.abspath(path)
        if full.startswith(HERE + os.sep) and "__pycache__" not in full:
            WRITES.append([what, os.path.relpath(full, HERE)])


def _audit(event: str, args: tuple) -> None:
    if event == "open":
        path, mode, flags = args
        writing = any(c in (mode or "") for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        if writing:
            _record("write", path)
    elif event in ("os.rename", "os.replace"):
        _record("rename-from", args[0])
        _record("rename-to", args[1])
    elif event == "os.remove":
        _record("remove", args[0])


sys.addaudithook(_audit)

import safetensors.torch  # noqa: E402
import torch  # noqa: E402


def _recorded(inner):
    """safetensors' ``save_file(tensors, filename)`` / ``save_model(model, filename)``, recording the file."""

    def wrapped(*a, **k):
        _record("write", k.get("filename", a[1] if len(a) > 1 else None))
        return inner(*a, **k)

    return wrapped


safetensors.torch.save_file = _recorded(safetensors.torch.save_file)
safetensors.torch.save_model = _recorded(safetensors.torch.save_model)

from tests.common.models import ClassificationDataset, DropoutMLP  # noqa: E402

if cli.lib == "transformers":
    from transformers import Trainer, TrainerCallback, TrainingArguments
else:
    from trainwell import Trainer, TrainerCallback, TrainingArguments


ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))  # torchrun --max-restarts: this agent's restarts
KILLED = os.path.join(cli.report, "killed")  # a process of this launch was killed already (torchrun restarted it)


class Kill(TrainerCallback):
    """Process ``--kill-rank`` dies at the end of ``--kill-step``, once per launch (not again after a restart)."""

    def on_step_end(self, args, state, control, **kwargs):
        if RANK == cli.kill_rank and state.global_step == cli.kill_step and not os.path.exists(KILLED):
            open(KILLED, "w").close()
            _write_report({"killed_at": state.global_step})
            os.kill(os.getpid(), signal.SIGKILL)


def _write_report(extra: dict) -> None:
    report = {"rank": RANK, "cwd": HERE, "attempt": ATTEMPT, "writes": WRITES, **REPORT, **extra}
    with open(os.path.join(cli.report, f"rank{RANK}.json"), "w") as fh:
        json.dump(report, fh)


REPORT: dict = {}
torch.manual_seed(0)
args = TrainingArguments(
    output_dir="out", use_cpu=not cli.no_use_cpu, report_to="none", disable_tqdm=True, max_steps=cli.steps,
    per_device_train_batch_size=4, learning_rate=0.05, save_strategy="steps", save_steps=cli.save_steps,
    logging_steps=1, save_on_each_node=cli.each, log_on_each_node=bool(cli.log_each), log_level="info",
    log_level_replica="error", ddp_find_unused_parameters=True if cli.find_unused else None,
)
try:
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=ClassificationDataset(n=64), callbacks=[Kill()])
    logging.getLogger("trainwell.multinode").info("an info line from process %d", RANK)
    REPORT.update(
        world_size=args.world_size, process_index=args.process_index, local_process_index=args.local_process_index,
        is_world_zero=trainer.is_world_process_zero(), is_local_zero=trainer.is_local_process_zero(),
        state_world_zero=trainer.state.is_world_process_zero, state_local_zero=trainer.state.is_local_process_zero,
        should_save=args.should_save, should_log=args.should_log,
        log_level=logging.getLogger("trainwell" if cli.lib == "trainwell" else "transformers").getEffectiveLevel(),
    )
    resume = True if cli.resume else None
    if cli.resume_last:
        import importlib

        last = importlib.import_module(f"{cli.lib}.trainer_utils").get_last_checkpoint
        resume = last(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=resume)
    REPORT.update(
        step=trainer.state.global_step,
        params={n: p.detach().flatten().tolist() for n, p in trainer.model.named_parameters()},
        losses=[h["loss"] for h in trainer.state.log_history if "loss" in h],
    )
except Exception as err:  # noqa: BLE001 - reported to the test
    REPORT.update(error=type(err).__name__, message=str(err))
    _write_report({})
    raise
_write_report({})
