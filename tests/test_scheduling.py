"""tests/common/scheduling.py: which tests scripts/test.sh runs alone (they launch several processes, bind a port or
start Ray), found from the code they run, through their helpers, without a marker."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.common.scheduling import LauncherFinder
from tests.common.timing import hang_timeout

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# These tests name launchers without running any: the automatic rule would run them alone, needlessly.
pytestmark = pytest.mark.parallel_safe


def _torchrun(script):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", script])


def _through_a_helper():
    return _torchrun("train.py")


def _accelerate():
    return ["accelerate", "launch", "--num_processes", "2"]


def _ray():
    import ray

    ray.init(num_cpus=2)


def _socket(sock):
    sock.bind(("127.0.0.1", 0))


def _plain():
    torchrun = "torchrun --nproc_per_node 8 train.py"  # prose in a string, and a local named like a launcher
    command = [sys.executable, "train.py"]
    assert torchrun and command  # pytest's rewriting of this assert adds the locals' names as constants
    return subprocess.run(command)


def test_launchers_are_found_through_helpers_and_plain_code_is_not():
    finder = LauncherFinder()
    for function in (_torchrun, _through_a_helper, _accelerate, _ray, _socket):
        assert finder.launches(function), function.__name__
    assert not finder.launches(_plain)


def test_the_suites_multi_process_tests_are_serial():
    """The rule finds the launchers of the real multi-process tests (their ``distributed`` marker aside)."""
    from tests import test_multinode, test_process_failures

    finder = LauncherFinder()
    assert finder.launches(test_multinode.test_save_on_each_node_on_a_shared_disk_is_refused)
    assert finder.launches(test_process_failures.test_a_process_that_fails_and_stays_does_not_keep_the_others_waiting)


SHARED_FIXTURE_MODULE = '''
import os
import pytest


@pytest.fixture(scope="module", params=["a", "b", "c"])
def built(request):
    with open(os.environ["BUILT_LOG"], "a") as log:
        log.write(request.param + "\\n")
    return request.param


def test_one(built):
    assert built


def test_two(built):
    assert built


def test_alone():
    pass


@pytest.mark.serial
@pytest.mark.parametrize("n", range(3))
def test_in_the_chain(n):
    with open(os.environ["BUILT_LOG"] + ".chain", "a") as log:
        log.write(f"{os.environ['PYTEST_XDIST_WORKER']} {os.nice(0)}\\n")
'''


def test_xdist_workers_build_a_shared_fixture_once_and_run_the_serial_tests_on_one_worker(tmp_path):
    """scripts/test.sh's --dist loadgroup keeps a module-scoped fixture's tests on one worker, so each of its values
    is built once, and the serial tests on one worker, which keeps its priority. pytest 9.2 renamed the attribute
    pytest-xdist 3.8 appends the group to: the groups were then silently ignored, each TRL script of
    tests/test_libraries.py ran twice and serial tests ran side by side (pyproject pins pytest below 9.2)."""
    pytest.importorskip("xdist")
    folder = tmp_path / "suite"
    folder.mkdir()
    # this suite's own grouping hook (tests/conftest.py), in a conftest of the little suite, which it counts as tests
    (folder / "conftest.py").write_text("import pathlib\nfrom tests.common import scheduling\n"
                                        "scheduling.TESTS = pathlib.Path(__file__).resolve().parent\n"
                                        "from tests.conftest import (  # noqa\n"
                                        "    pytest_collection_modifyitems, pytest_runtest_setup)\n")
    (folder / "test_shared.py").write_text(SHARED_FIXTURE_MODULE)
    log = tmp_path / "built.log"
    env = {**os.environ, "BUILT_LOG": str(log), "PYTHONPATH": ROOT}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist",
                          "loadgroup", str(folder)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=hang_timeout(300))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "10 passed" in run.stdout
    assert sorted(log.read_text().split()) == ["a", "b", "c"]
    # the serial tests: one worker, one after another, at the priority the others yield to
    chain = {tuple(line.split()) for line in (tmp_path / "built.log.chain").read_text().splitlines()}
    assert len(chain) == 1 and next(iter(chain))[1] == str(os.nice(0)), chain
