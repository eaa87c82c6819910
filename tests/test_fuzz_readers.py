"""Property-based tests of every reader of a run folder's files (issue 39): ``trainer_state.json``, the checkpoint
manifest, ``task.json``, ``training_args.json``, ``live_log.jsonl`` and the config of ``trainwell train``, each fed
random bytes, truncations of a valid file, deep nesting, huge numbers and NaN. Each ends in trainwell's documented
error type naming the file (``ValueError``; ``CliError`` for the command line) or in a value, never in another
exception, a hang or an unbounded read.

A short run in CI (``TRAINWELL_FUZZ_EXAMPLES``, 25 examples a reader by default: seconds); a long one::

    TRAINWELL_FUZZ_EXAMPLES=20000 python -m pytest -n 0 tests/test_fuzz_readers.py
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from trainwell.checkpoint import manifest  # noqa: E402
from trainwell.checkpoint.io import CheckpointFiles  # noqa: E402
from trainwell.checkpoint.resume import checkpoint_global_batch, incomplete_reason, manifest_problem  # noqa: E402
from trainwell.cli import CliError  # noqa: E402
from trainwell.state import TrainerState  # noqa: E402

EXAMPLES = int(os.environ.get("TRAINWELL_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))

# JSON values as a crafted file holds them: NaN and infinities, numbers past float and int64, deep-ish trees
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**1000), max_value=10**1000),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                       max_leaves=20)


def _nested(depth: int, kind: str) -> bytes:
    return (b"[" * depth + b"]" * depth) if kind == "list" else (b'{"a":' * depth + b"1" + b"}" * depth)


def _content(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """Bytes of a crafted file: random, a truncation of ``valid``, ``valid`` with one field replaced by any JSON
    value (NaN included), deep nesting, or a number with thousands of digits."""
    text = json.dumps(valid).encode()
    keys = sorted(valid)
    return st.one_of(
        st.binary(max_size=512),
        st.integers(min_value=0, max_value=len(text)).map(lambda cut: text[:cut]),
        st.tuples(st.sampled_from(keys), _VALUES).map(lambda kv: json.dumps({**valid, kv[0]: kv[1]}).encode()),
        st.builds(_nested, st.integers(min_value=1, max_value=200_000), st.sampled_from(["list", "dict"])),
        st.integers(min_value=1, max_value=20_000).map(lambda n: b'{"global_step": 1' + b"0" * n + b"}"),
        _VALUES.map(lambda v: json.dumps(v).encode()),
    )


def _folder(files: dict[str, bytes]) -> tuple[tempfile.TemporaryDirectory, Path]:
    holder = tempfile.TemporaryDirectory()
    folder = Path(holder.name) / "checkpoint-2"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return holder, folder


_STATE = {"global_step": 2, "epoch": 1.0, "max_steps": 4, "log_history": [{"loss": 1.0, "step": 1}],
          "train_batch_size": 2, "logging_steps": 1, "save_steps": 2, "eval_steps": 2}


@FUZZ
@given(_content(_STATE))
def test_trainer_state_json(data):
    holder, folder = _folder({"trainer_state.json": data})
    with holder:
        path = folder / "trainer_state.json"
        try:
            TrainerState.load_from_json(path)
        except ValueError as err:
            assert str(path) in str(err)
        reason = incomplete_reason(folder)  # a resume's check of the same file: a reason, never an exception
        assert isinstance(reason, str)


_MANIFEST = {"format": manifest.FORMAT, "version": 1, "checksum": "xxh3_64",
             "files": {"trainer_state.json": {"size": 2, "xxh3_64": "0a1b2c3d4e5f6071"}}}


@FUZZ
@given(_content(_MANIFEST))
def test_checkpoint_manifest(data):
    holder, folder = _folder({manifest.MANIFEST_NAME: data, "trainer_state.json": b"{}"})
    with holder:
        try:
            manifest.read(folder)
        except ValueError as err:
            assert manifest.MANIFEST_NAME in str(err)
        problem = manifest_problem(folder)
        assert problem is None or isinstance(problem, str)


_TASK = {"task": "text-classification", "text_column": "text", "label_column": "label", "labels": ["a", "b"],
         "tokenizer": "bytes", "max_length": 16}


@FUZZ
@given(_content(_TASK))
@example(b'{"task": []}')  # found by this test: a TypeError (unhashable) before the fix
def test_task_json(data):
    from trainwell.cli.inference import read_task

    holder, folder = _folder({"task.json": data})
    with holder:
        try:
            read_task(str(folder))
        except CliError as err:
            assert "task.json" in str(err)


_ARGS = {"gradient_accumulation_steps": 2, "save_only_model": False, "optim": "adamw_torch", "learning_rate": 1e-3,
         "warmup_steps": 0, "lr_scheduler_type": "linear", "max_steps": 4}


@FUZZ
@given(_content(_ARGS))
@example(b'{"lr_scheduler_type": [], "learning_rate": 0.001}')  # found by this test: a TypeError before the fix
@example(b'{"lr_scheduler_type": "linear", "learning_rate": 0.001, "warmup_steps": NaN}')  # a ValueError before
@example(b'{"lr_scheduler_type": "linear", "learning_rate": 1' + b"0" * 400 + b"}")  # an OverflowError before
def test_training_args_json(data):
    from trainwell.checkpoint.resume import warn_changed_arguments
    from trainwell.training_args import TrainingArguments

    holder, folder = _folder({"training_args.json": data, "trainer_state.json": json.dumps(_STATE).encode(),
                              "rng_state.pth": b""})
    with holder:
        files = CheckpointFiles(folder)
        try:
            saved = files.json("training_args.json")
        except ValueError as err:
            assert "training_args.json" in str(err)
            saved = None
        assert files.json_or_none("training_args.json") == saved or saved != saved  # NaN is not equal to itself
        state = TrainerState.from_dict(dict(_STATE))
        batch = checkpoint_global_batch(files, state)
        assert batch is None or isinstance(batch, int)
        assert isinstance(incomplete_reason(folder), (str, type(None)))
        args = TrainingArguments(str(folder.parent / "out"), max_steps=4, report_to="none")
        logging.disable(logging.WARNING)
        try:
            warn_changed_arguments(str(folder), state, args, 4, files.json_or_none("training_args.json"))
        finally:
            logging.disable(logging.NOTSET)


_LOG = {"kind": "log", "step": 1, "time": 1.0, "logs": {"loss": 1.0}}


@FUZZ
@given(st.lists(_content(_LOG), max_size=5), st.booleans())
def test_live_log_jsonl(lines, newline_at_end):
    from trainwell.report.live import read_live_log

    data = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    holder, folder = _folder({"live_log.jsonl": data})
    with holder:
        history = read_live_log(folder)  # bad lines are skipped (and counted): never an exception
        assert history is None or hasattr(history, "__dict__") or isinstance(history, tuple)


_CONFIG = {"task": "text-classification", "model": {"size": "tiny"}, "data": {"train": "train.csv"},
           "training": {"max_steps": 2}}


@FUZZ
@given(_content(_CONFIG), st.sampled_from([".json", ".yaml"]))
@example(b"\x80", ".json")  # found by this test: a UnicodeDecodeError before the fix
def test_train_config(data, suffix):
    from trainwell.cli.config import read_config

    holder, folder = _folder({f"config{suffix}": data})
    with holder:
        path = str(folder / f"config{suffix}")
        try:
            assert isinstance(read_config(path), dict)
        except CliError as err:
            assert path in str(err)


@pytest.mark.parametrize("name", ["trainer_state.json", manifest.MANIFEST_NAME, "training_args.json", "task.json"])
def test_a_huge_file_is_refused_without_being_read(tmp_path, name):
    """A 4 GiB file (sparse: no disk used) is refused by its size, before anything is read."""
    from trainwell.cli.inference import read_task

    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    with open(folder / name, "wb") as fh:
        fh.truncate(4 << 30)
    if name == "task.json":
        with pytest.raises(CliError, match="larger than"):
            read_task(str(folder))
    elif name == manifest.MANIFEST_NAME:
        with pytest.raises(ValueError, match="larger than"):
            manifest.read(folder)
    else:
        with pytest.raises(ValueError, match="larger than"):
            CheckpointFiles(folder).json(name)


def test_a_huge_config_is_refused_without_being_read(tmp_path):
    from trainwell.cli.config import read_config

    path = tmp_path / "config.yaml"
    with open(path, "wb") as fh:
        fh.truncate(4 << 30)
    with pytest.raises(CliError, match="larger than"):
        read_config(str(path))
