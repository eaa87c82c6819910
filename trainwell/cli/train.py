"""``trainwell train CONFIG.yaml [--key value ...]``: a config-driven training run.

Reads the config (``trainwell.cli.config``), builds the model and data (``trainwell.cli.build``, or for a
``task`` the tokenized data, collator, metrics and model: ``trainwell.cli.tasks``), trains
with any ``TrainingArguments`` the config sets, evaluates, saves the model and state, writes the run report,
and prints where everything is. ``--print-config`` shows the merged config and exits without training;
without a config it prints a commented template. Relative paths: see ``trainwell.cli.config.resolve_paths``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from typing import Any

from trainwell.cli import CliError, compact_console, interrupted_report, live_report_to, own_command

USAGE = ("trainwell train CONFIG.yaml [--key value ...]\n"
         "       trainwell train --print-config [CONFIG.yaml [--key value ...]]")

_NO_CONFIG = ("no config file given. Run `trainwell train CONFIG.yaml`; the --key value overrides after it are "
              "optional (e.g. `trainwell train run.yaml --max_steps 100`). To start a config, "
              "`trainwell train --print-config > run.yaml` writes a commented template.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = USAGE
    parser.set_defaults(_usage_hint=". The config file comes first, then the optional overrides: "
                                    "trainwell train CONFIG.yaml --key value ...")
    parser.add_argument("config", nargs="?", metavar="CONFIG.yaml",
                        help="a .yaml/.yml/.json file: TrainingArguments fields plus model/data sections")
    parser.add_argument("--print-config", action="store_true",
                        help="print the merged config and exit; without CONFIG.yaml, print a commented template")
    parser.add_argument("overrides", nargs=argparse.REMAINDER, metavar="--key value",
                        help="optional: override any config key (TrainingArguments fields, or nested keys like "
                             "--model.kwargs.size tiny); these win over the file")


def prepare(config_path: str, overrides: list[str]) -> tuple[dict[str, Any], Any]:
    """``(sections, TrainingArguments)`` from the file and overrides, every key and value checked. Relative file
    paths become absolute: those in the file against its folder, those in overrides against the current one."""
    from trainwell.cli import config as cfg
    from trainwell.training_args import TrainingArguments

    merged = cfg.apply_overrides(cfg.read_config(config_path), overrides)
    cfg.resolve_paths(merged, config_path, [name for name, _ in cfg.split_overrides(overrides)])
    sections, training = cfg.split_config(merged)
    training.setdefault("output_dir", "trainer_output")
    try:
        # each log in the run folder as it happens, for `trainwell report --watch` (a plain script asks for it)
        training["report_to"] = live_report_to(training.get("report_to", "none"))
        args = TrainingArguments(**training)
    except (TypeError, ValueError) as err:  # e.g. a mapping where a field wants a number, a tracker unknown
        raise CliError(str(err)) from None
    return sections, args


def _resume_target(value: Any, output_dir: str) -> Any:
    from trainwell.checkpoint.resume import get_last_checkpoint

    if value in (None, False):
        return None
    if value == "auto":
        return True if os.path.isdir(output_dir) and get_last_checkpoint(output_dir) else None
    if value is True or isinstance(value, str):
        return value
    raise CliError(f"resume_from_checkpoint={value!r}: pass a checkpoint path, true, false or 'auto'.")


def run(ns: argparse.Namespace) -> int:
    # argparse's REMAINDER also swallows this command's own flag when it comes after the config path.
    ns.print_config = ns.print_config or "--print-config" in ns.overrides
    overrides = [t for t in ns.overrides if t not in ("--", "--print-config")]
    if ns.config is None:
        return _without_config(ns.print_config)
    sections, args = prepare(ns.config, overrides)
    if ns.print_config:
        print(json.dumps({**sections, **args.to_dict()}, indent=2, default=str))
        return 0
    from trainwell.cli import build

    # Factory modules the config names may live beside it or in the current directory: those folders are searched
    # only for names that are not importable otherwise, and go on sys.path after the installed packages, for this
    # run only (see build.py and docs/cli.md).
    with build.factory_folders(ns.config):
        build.check_factories(sections)
        return _train(sections, args)


def _without_config(print_config: bool) -> int:
    if not print_config:
        raise CliError(_NO_CONFIG)
    from trainwell.cli.config import TEMPLATE

    print(TEMPLATE, end="")
    return 0


def _components(sections: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """``(Trainer keyword arguments, TaskRun or None)``: a task's tokenized data and model, or the factories'."""
    from trainwell.cli import build

    run = None
    if sections.get("task") is not None:
        from trainwell.cli import tasks

        run = tasks.prepare(sections)
        parts = run.trainer_kwargs()
        print(run.describe())
    else:
        if sections.get("tokenizer") is not None:
            raise CliError("tokenizer: a tokenizer is used by a task: add task: text-classification or causal-lm "
                           "(see docs/cli.md), or load it in your own data factory.")
        train_dataset, eval_dataset = build.build_data(sections.get("data"))
        parts = {"model": build.build_model(sections.get("model")), "train_dataset": train_dataset,
                 "eval_dataset": eval_dataset}
    # Factories the config names win over what a task provides.
    if sections.get("data_collator") is not None:
        parts["data_collator"] = build.call_factory(sections["data_collator"], "data_collator", call_plain=False)
    if sections.get("compute_metrics") is not None:
        parts["compute_metrics"] = build.call_factory(sections["compute_metrics"], "compute_metrics",
                                                      call_plain=False)
        parts.pop("preprocess_logits_for_metrics", None)  # the user's metrics may want the logits
    return parts, run


def _train(sections: dict[str, Any], args: Any) -> int:
    from trainwell import Trainer

    parts, run = _components(sections)
    trainer = Trainer(args=args, **parts)
    compact_console(trainer)
    resume = _resume_target(sections.get("resume_from_checkpoint"), args.output_dir)
    if args.should_save:
        print(f"watch it live in a browser: {own_command()} report --watch {shlex.quote(str(args.output_dir))}  (in "
              "another terminal)")
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except KeyboardInterrupt:
        _interrupted(trainer.state.global_step, args, report=sections.get("report", True))
        return 130
    trainer.save_model()
    trainer.save_state()
    print(f"\ntrained {result.global_step} steps; train loss {result.training_loss:.4g}")
    if parts.get("eval_dataset") is not None:
        metrics = trainer.evaluate()
        if run is not None and run.task.name == "causal-lm" and "eval_loss" in metrics:
            from trainwell.cli.tasks import perplexity

            metrics["eval_perplexity"] = perplexity(metrics["eval_loss"])
        print("evaluation: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in metrics.items()))
    print(f"model and trainer_state.json: {args.output_dir}")
    if run is not None:
        from trainwell.cli.tasks import TASK_FILE

        print(f"tokenizer and {TASK_FILE} (the task's settings{', labels by id' if run.labels else ''}): "
              f"{args.output_dir}")
        print(f"use the model: {own_command()} predict {shlex.quote(str(args.output_dir))} 'a text' (or --data FILE; "
              "see docs/cli.md)")
    if sections.get("report", True) and args.should_save:
        from trainwell.report import write_report

        report = write_report(args.output_dir)
        print(f"run report: {report.html}" + (f" ({report.note})" if report.note else ""))
    return 0


def _interrupted(step: int, args: Any, report: bool) -> None:
    """Ctrl-C during training: where the run stands, how to resume it, and its report so far (from its newest
    checkpoint and its live log), or the command that writes it."""
    from trainwell.checkpoint.resume import get_last_checkpoint

    newest = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    print(f"\ninterrupted at step {step}.", end=" ")
    if newest is None:
        print("No checkpoint was saved yet: the same command starts again from the first step.")
    else:
        print(f"To resume from {newest}, run the same command with --resume_from_checkpoint auto (or set "
              "resume_from_checkpoint: auto in the config).")
    if report and args.should_save:
        interrupted_report(args.output_dir)
