"""``trainwell demo``: the main job. Trains a small byte-level transformer on the standard library's sources.

Nothing is downloaded: the model is ``trainwell.examples.bytelm`` and the text is this Python's own ``.py``
files (``trainwell.examples.bytedata``), split into train and validation by file. The run shows a progress
bar, evaluates validation loss and perplexity, saves checkpoints, prints a generated sample, writes a run
report, and says where everything is. Run it again with the same ``--output-dir`` and it resumes from the
newest complete checkpoint: Ctrl-C saves a checkpoint of the step in progress (``enable_jit_checkpoint``),
and the same command then resumes there exactly. A rerun of a finished run says so at once, before building
anything, and leaves its files alone.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import time
from typing import Any

from trainwell.cli import (
    CliError,
    compact_console,
    interrupted_report,
    live_report_to,
    no_cuda_message,
    own_command,
)

# ~2 minutes on a 2-core CPU for the "small" model (measured; see docs/cli.md, `trainwell demo`).
DEFAULT_STEPS = 1000
_PROMPT = b"def "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help="optimizer steps to train (the total, counting steps done before a resume)")
    parser.add_argument("--size", default="small", choices=("tiny", "small", "medium"), help="model size")
    parser.add_argument("--output-dir", default="trainwell-demo",
                        help="where checkpoints, the model, logs and the report go; reusing it resumes")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "mps"),
                        help="auto: a GPU when one is present, else the CPU")
    parser.add_argument("--batch-size", type=int, default=16, help="blocks per step")
    parser.add_argument("--learning-rate", type=float, default=2e-3, help="peak learning rate (cosine schedule)")
    parser.add_argument("--evals", type=int, default=5, help="how many validation evaluations during training")
    parser.add_argument("--report-to", nargs="+", default=["none"], metavar="TRACKER",
                        help="experiment trackers (tensorboard, mlflow, wandb, trackio, jsonl, csv, all)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--no-report", action="store_true", help="skip writing the run report")
    parser.add_argument("--sample-bytes", type=int, default=240, help="length of the generated sample")


def _check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise CliError(no_cuda_message("--device cuda"))
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise CliError("--device mps: the MPS backend is not available. Use --device auto or cpu.")


def _check_steps(steps: int) -> None:
    if steps < 1:
        raise CliError(f"--steps {steps}: pass a positive number of steps.")


def training_arguments(ns: argparse.Namespace, resuming: bool) -> Any:
    """The demo's ``TrainingArguments``: cosine schedule with warmup, evaluation and checkpoints at each of
    ``ns.evals`` evenly spaced steps, token counting for the throughput shown on the bar."""
    from trainwell import TrainingArguments

    _check_steps(ns.steps)
    every = max(1, ns.steps // max(1, ns.evals))
    return TrainingArguments(
        output_dir=ns.output_dir, max_steps=ns.steps, per_device_train_batch_size=ns.batch_size,
        per_device_eval_batch_size=64, learning_rate=ns.learning_rate, lr_scheduler_type="cosine",
        warmup_steps=max(1, ns.steps // 20), weight_decay=0.1, adam_beta2=0.99, max_grad_norm=1.0,
        logging_steps=max(1, min(10, ns.steps // 20)), eval_strategy="steps", eval_steps=every,
        eval_on_start=not resuming, save_strategy="steps", save_steps=every, save_total_limit=2,
        include_num_input_tokens_seen="all", report_to=live_report_to(ns.report_to), seed=ns.seed, data_seed=ns.seed,
        use_cpu=ns.device == "cpu", disable_tqdm=False, dataloader_num_workers=0,
        dataloader_pin_memory=ns.device in ("auto", "cuda") and _gpu_present(),
        enable_jit_checkpoint=True,  # Ctrl-C saves the step in progress, so the rerun resumes there
    )


def _make_trainer_class() -> type:
    from trainwell import Trainer

    class DemoTrainer(Trainer):
        """Adds validation perplexity (exp of the mean loss) to every evaluation log."""

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if "eval_loss" in logs:  # in place, as Trainer.log itself adds epoch: evaluate() returns it too
                logs["eval_perplexity"] = _perplexity(logs["eval_loss"])
            super().log(logs, start_time)

    return DemoTrainer


def _perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))  # capped: a diverged run prints a huge number, not an OverflowError


def _eval_losses(log_history: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [(int(e["step"]), float(e["eval_loss"])) for e in log_history if "eval_loss" in e]


def run(ns: argparse.Namespace) -> int:
    _check_device(ns.device)
    _check_steps(ns.steps)
    from trainwell.checkpoint.resume import get_last_checkpoint

    started = time.monotonic()
    resume = get_last_checkpoint(ns.output_dir) if os.path.isdir(ns.output_dir) else None
    done = _finished_step(ns.output_dir, resume)
    if done is not None and done >= ns.steps:
        _say_complete(ns, done)  # before the data and the model are built: nothing to train, nothing rewritten
        return 0
    try:
        trainer = _build_trainer(ns, resume)
    except KeyboardInterrupt:
        print("\ninterrupted while setting up, before any training step; nothing was saved. Run the same command "
              "again to carry on.")
        return 130
    first_step = (_state_step(resume) or 0) if resume else 0
    try:
        result = trainer.train(resume_from_checkpoint=True if resume else None)
    except KeyboardInterrupt:  # enable_jit_checkpoint saved the step in progress first (unless Ctrl-C twice)
        _say_interrupted(ns, trainer.state.global_step, first_step)
        if not ns.no_report:
            interrupted_report(ns.output_dir)
        return 130
    trainer.save_model()
    trainer.save_state()
    _finish(ns, trainer, result, started, first_step)
    return 0


def _build_trainer(ns: argparse.Namespace, resume: str | None) -> Any:
    from trainwell.examples.bytedata import ByteBlocks, stdlib_corpus
    from trainwell.examples.bytelm import build_model
    from trainwell.utils.seed import set_seed

    set_seed(ns.seed)  # the initial weights too follow --seed, so two fresh runs print the same numbers
    model = build_model(ns.size)
    block = model.config.block_size
    corpus = stdlib_corpus(max_train_bytes=4_000_000, max_validation_bytes=400_000)
    train = ByteBlocks(corpus.train, block)
    validation = ByteBlocks(corpus.validation, block, max_blocks=128 if ns.size != "tiny" else 32)
    print(f"trainwell demo: a {ns.size} byte-level transformer ({model.num_parameters() / 1e6:.2f}M parameters, "
          f"context {block} bytes)")
    print(f"data: Python's standard library sources in {corpus.root}: {corpus.train_files} files for training "
          f"({len(corpus.train) / 1e6:.1f} MB), {corpus.validation_files} other files for validation")
    if resume:
        print(f"resuming from {resume} (another --output-dir starts afresh)")
    # The tokenizer writes task.json beside the model and into every checkpoint: `trainwell predict` rebuilds the
    # model from it (the built-in "transformer" of this size over bytes) and reads its input as bytes.
    trainer = _make_trainer_class()(model=model, args=training_arguments(ns, bool(resume)), train_dataset=train,
                                    eval_dataset=validation, processing_class=demo_tokenizer(ns.size, block))
    compact_console(trainer)  # one short line per log above the bar, not two wrapped lines of quoted strings
    print(f"device: {trainer.args.device}; training to step {ns.steps} in {ns.output_dir} "
          "(Ctrl-C saves a checkpoint of the step in progress, then stops)")
    print(f"watch it live in a browser: {own_command()} report --watch {shlex.quote(str(ns.output_dir))}  (in another "
          "terminal)\n")
    return trainer


def demo_tokenizer(size: str, block_size: int) -> Any:
    """The demo's tokenizer (bytes), carrying the ``task.json`` that makes its model usable by ``trainwell
    predict``: a causal LM over bytes, the built-in ``transformer`` of ``size`` with 256 ids."""
    from trainwell.cli.tasks import TASK_FILE
    from trainwell.cli.tokenizer import ByteTokenizer

    task = {"task": "causal-lm", "text_column": "text", "block_size": block_size,
            "model": {"builtin": "transformer", "kwargs": {"vocab_size": 256, "block_size": block_size, "size": size}},
            "tokenizer": ByteTokenizer.NAME, "pad_token_id": None, "eos_token_id": None,
            # the sample's sampling: a byte model's single most probable next byte is mostly a space
            "generation": {"temperature": 0.8, "top_k": 40}}
    return ByteTokenizer({TASK_FILE: task})


def _finished_step(output_dir: str, checkpoint: str | None) -> int | None:
    """The newest checkpoint's step when the run that wrote it also finished (its final ``trainer_state.json``
    in ``output_dir`` is at least as far); None otherwise, so a run stopped after its last checkpoint but
    before the model, state and report were written gets them on the next call."""
    done = _state_step(checkpoint) if checkpoint else None
    final = _state_step(output_dir) if done is not None else None
    return done if final is not None and final >= done else None


def _state_step(folder: str) -> int | None:
    """The ``global_step`` in a folder's ``trainer_state.json`` (None when it cannot be read)."""
    from trainwell.checkpoint.layout import TRAINER_STATE_NAME
    from trainwell.utils.safe_files import read_json

    try:
        return int(read_json(os.path.join(folder, TRAINER_STATE_NAME), 1 << 30, root=folder)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _say_complete(ns: argparse.Namespace, done: int) -> None:
    asked = "as --steps asks" if done == ns.steps else f"past the --steps {ns.steps} asked for"
    print(f"{ns.output_dir} is already trained to step {done}, {asked}: nothing to train, and its files are left "
          "as they are.")
    print(f"To train further, run again with a larger --steps (e.g. --steps {2 * done}); it resumes from step "
          f"{done}. Another --output-dir starts afresh.")
    report = os.path.join(ns.output_dir, "report", "index.html")
    if os.path.exists(report):
        print(f"The run report: {report}")


def _say_interrupted(ns: argparse.Namespace, step: int, first_step: int = 0) -> None:
    from trainwell.checkpoint.resume import get_last_checkpoint

    last = get_last_checkpoint(ns.output_dir) if os.path.isdir(ns.output_dir) else None
    if last is None:
        where = "from the start (no checkpoint was complete yet)"
    elif _state_step(last) == step:
        where = f"from {last}, saved just now"
    else:
        where = f"from {last}"
    # Before its first step a resumed session has not read the checkpoint's step yet (its state says 0).
    when = f"at step {step}" if step > first_step else "before this session's first step"
    print(f"\ninterrupted {when}. Run the same command again to resume {where}.")


def _finish(ns: argparse.Namespace, trainer: Any, result: Any, started: float, first_step: int) -> None:
    evals = _eval_losses(trainer.state.log_history)
    if not evals or evals[-1][0] != trainer.state.global_step:
        metrics = trainer.evaluate()
        evals.append((trainer.state.global_step, metrics["eval_loss"]))
    (s0, first), (s1, last) = evals[0], evals[-1]
    sample = trainer.model.generate(_PROMPT, max_new_bytes=ns.sample_bytes, seed=ns.seed)
    print("\n--- generated sample (prompt: 'def ') " + "-" * 40)
    print((_PROMPT + sample).decode("utf-8", errors="replace"))
    print("-" * 79)
    print(f"validation loss: {first:.3f} at step {s0} (perplexity {_perplexity(first):.1f}) -> "
          f"{last:.3f} at step {s1} (perplexity {_perplexity(last):.1f})")
    session = (f"steps {first_step}-{result.global_step}, resumed at {first_step}" if first_step else
               f"steps 0-{result.global_step}")
    print(f"training: {result.global_step - first_step} steps this session ({session}), "
          f"{result.metrics.get('train_runtime', 0):.1f} s; wall time {time.monotonic() - started:.1f} s")
    out = ns.output_dir
    print("\nwhere everything is:")
    print(f"  model weights    {os.path.join(out, 'model.safetensors')}")
    # The run is complete: the same command again would only say so; a larger --steps trains further from here.
    print(f"  checkpoints      {out}/checkpoint-*  (to train further: the same command with --steps "
          f"{2 * result.global_step})")
    print(f"  trainer state    {os.path.join(out, 'trainer_state.json')}")
    print(f"  use the model    {own_command()} predict {shlex.quote(str(out))} 'def '  (a continuation of each text "
          "given)")
    if not ns.no_report:
        from trainwell.report import write_report

        report = write_report(out)
        print(f"  run report       {report.html}" + (f"  ({report.note})" if report.note else ""))
        print(f"  plots            {', '.join(str(p) for p in report.images) or 'none'}")


def _gpu_present() -> bool:
    import torch

    return torch.cuda.is_available()
