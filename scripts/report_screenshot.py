"""Regenerate ``docs/images/report.png``: the plots of ``trainwell report`` for a real, resumed demo run.

Trains the demo's tiny byte-level transformer (``trainwell demo --size tiny``: Python's standard library as
data, CPU, no download) for ``--steps`` steps in two sessions: the first is stopped at ``--stop-at`` right after
its checkpoint, as Ctrl-C would stop it, and the second resumes from that checkpoint. Then it draws the report's
figures (``trainwell.report.plots.run_figures``, the same code as ``trainwell report``) and puts four of them
side by side in one PNG: the smoothed train loss with validation loss, the validation perplexity (log scale),
the learning rate and the throughput, each with the resume marked. It also prints the text summary.

    python scripts/report_screenshot.py                      # about a minute on 2 CPU cores
    python scripts/report_screenshot.py --steps 400 --stop-at 200 --out /tmp/report.png
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

PANELS = ("loss", "eval_perplexity", "learning_rate", "throughput")


def _stop_at(step: int):
    from trainwell import TrainerCallback

    class StopAt(TrainerCallback):
        """Stops training after ``step`` (its checkpoint is written first), like Ctrl-C in the demo."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= step:
                control.should_training_stop = True
            return control

    return StopAt()


def train_resumed_run(output_dir: str, steps: int, stop_at: int) -> None:
    """The demo's run, in two ``train()`` calls: stopped at ``stop_at``, then resumed to ``steps``."""
    from trainwell.cli.demo import _make_trainer_class, training_arguments
    from trainwell.examples.bytedata import ByteBlocks, stdlib_corpus
    from trainwell.examples.bytelm import build_model
    from trainwell.utils.seed import set_seed

    ns = argparse.Namespace(steps=steps, evals=5, output_dir=output_dir, batch_size=16, learning_rate=2e-3,
                            report_to=["none"], seed=42, device="cpu")
    every = stop_at // 3 if stop_at % 3 == 0 else stop_at  # evaluations and checkpoints: one falls on stop_at
    corpus = stdlib_corpus(max_train_bytes=4_000_000, max_validation_bytes=400_000)
    for session, resume in ((1, False), (2, True)):
        set_seed(ns.seed)
        model = build_model("tiny")
        args = training_arguments(ns, resuming=resume)
        args.disable_tqdm = True
        args.eval_steps = args.save_steps = every
        trainer = _make_trainer_class()(
            model=model, args=args, train_dataset=ByteBlocks(corpus.train, model.config.block_size),
            eval_dataset=ByteBlocks(corpus.validation, model.config.block_size, max_blocks=32),
            callbacks=[_stop_at(stop_at)] if session == 1 else None)
        with contextlib.redirect_stdout(io.StringIO()):  # the per-log lines; the summary is printed at the end
            trainer.train(resume_from_checkpoint=True if resume else None)
        trainer.save_state()
        trainer.save_model()


def composite(run_dir: str, out: Path) -> None:
    """Four of the report's figures in a 2 x 2 grid, saved as one PNG at ``out``."""
    from matplotlib.figure import Figure
    from matplotlib.image import imread

    from trainwell.report import load_run
    from trainwell.report.plots import run_figures

    run = load_run(run_dir, name="demo")
    figures = run_figures(run)
    sheet = Figure(figsize=(14, 7.4), dpi=80, layout="constrained")
    resumes = ", ".join(str(s.start_step) for s in run.sessions[1:])
    sheet.suptitle(f"trainwell report: the tiny demo model, {run.state['global_step']} steps, resumed at step "
                   f"{resumes}", fontsize=13)
    for i, name in enumerate(PANELS):
        buffer = io.BytesIO()
        figures[name].savefig(buffer, format="png")
        buffer.seek(0)
        ax = sheet.add_subplot(2, 2, i + 1)
        ax.imshow(imread(buffer, format="png"))
        ax.set_axis_off()
    out.parent.mkdir(parents=True, exist_ok=True)
    sheet.savefig(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images" / "report.png"))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--stop-at", type=int, default=300, help="where the first session stops")
    parser.add_argument("--run-dir", default=None, help="keep the run here (default: a temporary folder)")
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = ns.run_dir or os.path.join(tmp, "demo")
        train_resumed_run(run_dir, ns.steps, ns.stop_at)
        composite(run_dir, Path(ns.out))
        from trainwell.report import load_run, summary_text

        print(summary_text(load_run(run_dir, name="demo")))
    print(f"\nwrote {ns.out} ({Path(ns.out).stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
