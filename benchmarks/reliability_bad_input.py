"""Bad and edge inputs: does each library say clearly, and early, what is wrong?

The inputs are the rows of trainwell's own tables, imported from the test files: ``tests/test_bad_input.py``
(``ROWS``: bad ``TrainingArguments`` values, e.g. ``learning_rate=nan``, ``adam_beta1=1.0``, ``optim='adamw_torh'``),
``tests/test_bad_trainer_input.py`` (``ROWS``: bad ``Trainer(...)`` arguments, e.g. ``model='bert-base'``,
``optimizers=(torch.optim.AdamW, None)``; ``RUNTIME``: a ``compute_metrics`` returning a float, a missing metric).
Each row is given to each library the same way. ``TrainingArguments`` rows: ``TrainingArguments(**row)`` (plus
``output_dir``, ``report_to='none'``, ``use_cpu=True``), then a ``Trainer`` over a 1-layer BERT classifier (built
from a config) trained 3 steps (a callback stops it). Trainer rows: the row's builder, given the library's own
``TrainingArguments``. RUNTIME rows: 4 steps with an evaluation at step 4. Warnings (``warnings`` and the
libraries' loggers) are recorded. Each outcome is one of:

* ``error at construction, naming the argument``: ``TrainingArguments(...)`` or ``Trainer(...)`` raised, and the
  message contains the argument's name (``learning_rate``, ``optimizers``, ``compute_metrics``...);
* ``warning at construction, naming it``: it warned then, naming the argument (whatever ``train()`` did next);
* ``error at construction, not naming it``: early, but the message does not say which argument (``adamw_torh is
  not a valid OptimizerNames``, ``'dict' object has no attribute 'full_determinism'``);
* ``error in train(), naming it`` / ``warning in train(), naming it``: later, but the message names it;
* ``crash in train(), not naming it``: an exception from deeper down (``Invalid beta parameter at index 0: 1.0``,
  ``ZeroDivisionError``);
* ``silently accepted``: 3 steps trained, nothing said; ``hang``: no answer within 60 s.

"Clear and early" counts the first two kinds. ``args=transformers.TrainingArguments(...)`` is a bad input only for
trainwell (n/a for the reference). Each library runs in its own fresh interpreter.

    .venv/bin/python benchmarks/reliability_bad_input.py [--verbose] [--library trainwell|transformers|both]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability_common import add_library_flag, answer, load, print_table, run_controller, selected  # noqa: E402

CATEGORIES = ["error at construction, naming the argument", "warning at construction, naming it",
              "error at construction, not naming it", "error in train(), naming it", "warning in train(), naming it",
              "crash in train(), not naming it", "silently accepted", "hang (60 s)", "n/a"]
CLEAR = CATEGORIES[:2]
TIMEOUT_S = 60


class Hang(Exception):
    pass


@contextlib.contextmanager
def recorded():
    """Every warning and WARNING+ log record of the run so far, as text: call what it yields."""
    logged: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage())

    handler, loggers = Keep(logging.WARNING), [logging.getLogger(n) for n in ("", "transformers", "trainwell")]
    for logger in loggers:
        logger.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield lambda: logged + [str(w.message) for w in caught]
        finally:
            for logger in loggers:
                logger.removeHandler(handler)


def _alarm(signum, frame):
    raise Hang


def cases(library: str):
    """(id, argument name, kind, row) for every row of the three tables."""
    import tests.test_bad_input as args_table
    import tests.test_bad_trainer_input as trainer_table

    for kwargs, _, _ in args_table.ROWS:
        row_id = ",".join(f"{k}={v!r}" for k, v in kwargs.items())[:60]
        yield row_id, next(iter(kwargs)), "args", kwargs
    for param in trainer_table.ROWS:
        shown = param.values[-1]
        name = re.match(r"\w+", shown).group(0)
        yield param.id, "model_init" if name == "returned" else name, "trainer", param.values[0]
    for param in trainer_table.RUNTIME:
        compute_metrics, overrides, *_, shown = param.values
        found = re.match(r"\w+", shown)
        name = found.group(0) if found and found.group(0) != "returned" else "compute_metrics"
        yield "runtime-" + param.id, name, "runtime", (compute_metrics, overrides)


def tiny_bert():
    """A 1-layer BERT classifier built from a config (no download): label smoothing, NEFTune and gradient
    checkpointing need a transformers model in the reference."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=3))


class Tokens:
    """``n`` seeded samples of 8 token ids, an attention mask and a class label (a map-style dataset)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        import torch

        g = torch.Generator().manual_seed(seed)
        self.ids, self.labels = torch.randint(1, 64, (n, 8), generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.ids[i] * 0 + 1, "labels": self.labels[i]}


def run_case(lib, kind: str, name: str, row, work: str) -> tuple[str, str]:
    """(category, the message that decided it)."""
    from tests.common.models import RegressionDataset, RegressionModel

    class StopAfter(lib.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= 3:
                control.should_training_stop = True

    base = dict(output_dir=os.path.join(work, "out"), report_to="none", use_cpu=True, disable_tqdm=True)
    phase, real_access = "construction", os.access
    with recorded() as seen:
        try:
            signal.alarm(TIMEOUT_S)
            if kind == "args":
                kwargs = dict(row)
                for key, value in kwargs.items():  # <FILE>: an existing file; <DIR>: a folder we may not write
                    if isinstance(value, str) and value.startswith("<FILE>"):
                        open(os.path.join(work, "a_file"), "w").close()
                        kwargs[key] = value.replace("<FILE>", os.path.join(work, "a_file"))
                    elif isinstance(value, str) and value.startswith("<DIR>"):
                        folder = os.path.join(work, "read_only")
                        os.mkdir(folder)
                        os.access = lambda p, mode, real=real_access, ro=folder: p != ro and real(p, mode)
                        kwargs[key] = value.replace("<DIR>", folder)
                args = lib.TrainingArguments(**{**base, **kwargs})
                trainer = lib.Trainer(model=tiny_bert(), args=args, train_dataset=Tokens(48),
                                      eval_dataset=Tokens(16, seed=1), callbacks=[StopAfter()])
            elif kind == "trainer":
                kit = Kit(lib, base)
                kwargs = {"model": kit.model, "args": kit.args(), "train_dataset": kit.data, **row(kit)}
                trainer = lib.Trainer(**kwargs)
                trainer.add_callback(StopAfter())
            else:
                compute_metrics, overrides = row
                args = lib.TrainingArguments(**{**base, **dict(
                    max_steps=4, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=4,
                    per_device_eval_batch_size=4, **overrides)})
                trainer = lib.Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=16),
                                      eval_dataset=RegressionDataset(length=8), compute_metrics=compute_metrics)
            early = [m for m in seen() if name in m]
            phase = "train"
            trainer.train()
        except Hang:
            return "hang (60 s)", ""
        except Exception as err:  # noqa: BLE001 - classifying every failure is the point
            text = f"{type(err).__name__}: {err}"
            if phase == "train" and early:  # told before train(); what train() then did is the input's doing
                return "warning at construction, naming it", early[0]
            early_phase = phase == "construction"
            if name not in text:
                return ("error at construction, not naming it" if early_phase else "crash in train(), not naming it",
                        text)
            return ("error at construction, naming the argument" if early_phase else "error in train(), naming it",
                    text)
        finally:
            signal.alarm(0)
            os.access = real_access
        late = [m for m in seen() if name in m and m not in early]
    if early:
        return "warning at construction, naming it", early[0]
    if late:
        return "warning in train(), naming it", late[0]
    return "silently accepted", ""


class Kit:
    """The test table's Kit (model, optimizers, data, argument factory) with the library's own TrainingArguments."""

    def __init__(self, lib, base: dict) -> None:
        import torch

        from tests.common.models import RegressionDataset, RegressionModel

        self.lib, self.base, self.out_dir = lib, base, base["output_dir"]
        self.model, self.other_model = RegressionModel(), RegressionModel()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.foreign_opt = torch.optim.SGD(self.other_model.parameters(), lr=0.1)
        self.half_opt = torch.optim.SGD([self.model.a], lr=0.1)
        self.data = RegressionDataset(length=16)

    def args(self, **kwargs):
        return self.lib.TrainingArguments(**{**self.base, "save_strategy": "no", **kwargs})


def controller(library: str) -> dict:
    import torch

    os.environ["HF_HUB_OFFLINE"] = "1"  # push_to_hub='maybe' must not reach the network
    torch.set_num_threads(1)
    lib = load(library)
    logging.getLogger("trainwell").setLevel(logging.WARNING)
    if library == "transformers":
        lib_module = sys.modules["transformers"]
        lib_module.logging.set_verbosity_warning()
        import tests.test_bad_trainer_input as trainer_table

        class MyCallback(lib.TrainerCallback):  # the table's callbacks, derived from the reference's base class
            pass

        trainer_table.MyCallback = MyCallback
    signal.signal(signal.SIGALRM, _alarm)
    rows, here = [], os.getcwd()
    for row_id, name, kind, row in cases(library):
        if library != "trainwell" and row_id == "args-transformers":
            rows.append({"id": row_id, "name": name, "category": "n/a", "message": ""})
            continue
        with tempfile.TemporaryDirectory(prefix="reliability-bad-input-") as work:
            os.chdir(work)  # the default output_dir is relative
            try:
                category, message = run_case(lib, kind, name, row, work)
            finally:
                os.chdir(here)
        rows.append({"id": row_id, "name": name, "category": category, "message": message.replace(work, "<tmp>")})
    return {"rows": rows, "version": lib.version}


def report(results: dict[str, dict], verbose: bool) -> None:
    libs = list(results)
    total = len(next(iter(results.values()))["rows"])
    print(f"\n== {total} bad or edge inputs (tests/test_bad_input.py, tests/test_bad_trainer_input.py) ==")
    rows = []
    for category in CATEGORIES:
        counts = [sum(r["category"] == category for r in results[lib]["rows"]) for lib in libs]
        if any(counts):
            rows.append((category, *counts))
    rows.append(("clear and early (the first two)",
                 *[sum(r["category"] in CLEAR for r in results[lib]["rows"]) for lib in libs]))
    print_table(rows, libs, {lib: results[lib]["version"] for lib in libs})
    if verbose or len(libs) > 1:
        by_id = {lib: {r["id"]: r for r in results[lib]["rows"]} for lib in libs}
        print("\nper input (" + " | ".join(libs) + ")" + ("" if verbose else ": where trainwell is not early"))
        for r in results[libs[0]]["rows"]:
            mine = by_id[libs[0]][r["id"]]
            if verbose or mine["category"] not in CLEAR:
                print(f"  {r['id'][:58]:<60}" + " | ".join(
                    f"{by_id[lib][r['id']]['category']}: {by_id[lib][r['id']]['message'][:90]!r}" for lib in libs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_library_flag(parser)
    parser.add_argument("--verbose", action="store_true", help="one line per input, with each library's message")
    parser.add_argument("--controller", action="store_true", help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.controller:
        answer(controller(cli.library))
        return
    results = {}
    for lib in selected(cli.library):
        start = time.perf_counter()
        results[lib] = run_controller(os.path.abspath(__file__), ["--controller", "--library", lib])
        print(f"{lib}: done in {time.perf_counter() - start:.0f} s", flush=True)
    report(results, cli.verbose)


if __name__ == "__main__":
    main()
