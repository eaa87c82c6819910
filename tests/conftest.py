"""Shared fixtures: every test runs in its own temporary output folder, on the CPU, quietly."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.hookimpl(tryfirst=True)  # before -m "serial" / "not serial" selects on the marks added here
def pytest_collection_modifyitems(config, items):
    """Marks the tests that need the machine alone ``serial`` (scripts/test.sh runs them after the others), and
    keeps the tests of a module-scoped fixture on one xdist worker: tests/common/scheduling.py says how."""
    from tests.common.scheduling import schedule

    schedule(items)


@pytest.fixture
def out_dir(tmp_path):
    return str(tmp_path / "out")


def make_args(out_dir, **kwargs):
    """TrainingArguments with quiet, CPU-only defaults for tests (any field can be overridden)."""
    from trainwell import TrainingArguments

    defaults = dict(output_dir=out_dir, report_to="none", disable_tqdm=True, use_cpu=True, save_strategy="no")
    defaults.update(kwargs)
    return TrainingArguments(**defaults)
