"""tests/common/scheduling.py: which tests scripts/test.sh runs alone (they launch several processes, bind a port or
start Ray), found from the code they run, through their helpers, without a marker."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.common.scheduling import LauncherFinder

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
