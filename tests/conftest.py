"""Shared fixtures: every test runs in its own temporary output folder, on the CPU, quietly."""

from __future__ import annotations

import gc
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread per test process (and for the processes tests start): pytest-xdist's workers, a test's own
# subprocesses and the machine's other work already fill the cores, and OpenMP threads that outnumber them wait for
# each other at every op: a PEFT test of a 2-layer model took 8.6 s with 2 threads, 1.1 s with one, on 2 busy cores.
# Set OMP_NUM_THREADS to choose otherwise.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): the variable came too late for it
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_report_header(config):
    """Says how much the hang guards are scaled on this machine now (tests/common/timing.py)."""
    from tests.common.timing import slowdown

    return f"hang guards: x{slowdown():.1f} for this machine's measured slowdown (tests/common/timing.py)"


@pytest.hookimpl(tryfirst=True)  # before -m "serial" / "not serial" selects on the marks added here
def pytest_collection_modifyitems(config, items):
    """Marks the tests that need the machine to themselves ``serial`` and keeps the tests of a module-scoped
    fixture on one xdist worker; on xdist workers the serial tests are one group, run first, one at a time, on one
    worker: tests/common/scheduling.py says how."""
    from tests.common.scheduling import schedule

    on_workers = bool(getattr(config.option, "numprocesses", None)) or "PYTEST_XDIST_WORKER" in os.environ
    schedule(items, distributed=on_workers)


_FROZEN_UP_TO: list[str] = []  # the module whose first test last froze the heap


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """An xdist worker that does not run the serial chain yields the cores to it (tests/common/scheduling.py).

    At each test module's first test, collect garbage and freeze what is left (``gc.freeze``): the imported
    libraries (torch, transformers, Ray, ...) are some 800,000 objects, which every full collection walks again,
    and Accelerate's out-of-memory retries, the memory metrics and a Trainer's clean-up each call ``gc.collect()``
    (0.3-1 s each in such a heap; 15 s for one batch-size search). Frozen objects are never collected, so the
    collection comes first: only what is still alive is frozen."""
    from tests.common.scheduling import yield_to_the_serial_chain

    yield_to_the_serial_chain(item)
    module = item.nodeid.split("::")[0]
    if _FROZEN_UP_TO[-1:] != [module]:
        _FROZEN_UP_TO[:] = [module]
        gc.collect()
        gc.freeze()


@pytest.fixture
def out_dir(tmp_path):
    return str(tmp_path / "out")


def make_args(out_dir, **kwargs):
    """TrainingArguments with quiet, CPU-only defaults for tests (any field can be overridden)."""
    from trainwell import TrainingArguments

    defaults = dict(output_dir=out_dir, report_to="none", disable_tqdm=True, use_cpu=True, save_strategy="no")
    defaults.update(kwargs)
    return TrainingArguments(**defaults)


@pytest.fixture
def clean_launcher_env(monkeypatch):
    """No launcher's variables (Accelerate's mixed precision, torchrun's ranks) from the environment the suite runs
    in: the TrainingArguments tests ask for it (``pytestmark``)."""
    for name in ("ACCELERATE_MIXED_PRECISION", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def no_support_check(monkeypatch):
    """For mapping tests whose target field trainwell does not act on yet (so construction would refuse it)."""
    from trainwell.args import support

    monkeypatch.setattr(support, "check_supported", lambda args, defaults: None)
