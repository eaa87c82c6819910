"""A process of a multi-process run that dies, hangs or fails never leaves the others hanging.

Two processes under torchrun (gloo, CPU); process 1 fails on purpose (tests/distributed/failure_script.py). Process
0 must stop within a bounded time with a ``ProcessFailure`` that names process 1 and what process 0 was doing, and
the output folder stays resumable. The unit tests check the wording without processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from tests.common.timing import hang_timeout

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed", "failure_script.py")


def _run(workdir, *flags: str) -> tuple[dict[int, dict], str]:
    """Each process's result (when it wrote one) and the whole log."""
    # torchrun's agent looks at its processes every 0.1 s and SIGTERMs the others once one died: on a loaded machine
    # it could end process 0 before process 0 saw process 1 go, and these tests are about what process 0 says
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--monitor-interval", "5", SCRIPT,
              "--workdir", str(workdir), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=hang_timeout(300))
    log = proc.stdout + proc.stderr
    results = {}
    for rank in (0, 1):
        path = workdir / f"result-{rank}.json"
        if path.is_file():
            results[rank] = json.loads(path.read_text())
            path.unlink()  # a later run in the same folder writes its own
    return results, log


@pytest.mark.distributed
@pytest.mark.parametrize(("fail", "doing"), [
    ("kill", "was averaging the logged loss over processes at the end of step 3"),
    ("kill-in-eval", "in an evaluation at step 3"),
    ("kill-in-save", "while saving checkpoint-4"),
])
def test_a_killed_process_is_named_with_what_the_survivor_was_doing(tmp_path, fail, doing):
    step = "4" if fail == "kill-in-save" else "3"
    results, log = _run(tmp_path, "--fail", fail, "--step", step)
    survivor = results.get(0)
    assert survivor is not None and survivor["error"] == "ProcessFailure", log[-5000:]
    message = survivor["message"]
    assert "Process 1 stopped without a word" in message and "process 0 of 2" in message, message
    assert doing in message, message
    assert "resume with train(resume_from_checkpoint=True)" in message and "checkpoint-2" in message, message
    if fail == "kill-in-save":  # the folder stays resumable: the run finishes from checkpoint-2
        resumed, log = _run(tmp_path, "--fail", "none", "--resume")
        assert resumed[0].get("step") == 6 and resumed[1].get("step") == 6, log[-5000:]


@pytest.mark.distributed
def test_a_process_that_fails_and_stays_does_not_keep_the_others_waiting(tmp_path):
    # Process 1 catches its error and sleeps 120 s, holding the process group open; ddp_timeout is 600 s. The
    # survivor's watchdog learns of the failure through the store and ends process 0, naming process 1's error.
    import time

    start = time.monotonic()
    results, log = _run(tmp_path, "--fail", "raise-and-stay", "--step", "3")
    assert time.monotonic() - start < 100, log[-5000:]
    assert results.get(1, {}).get("error") == "RuntimeError", log[-5000:]
    assert 0 not in results  # ended by its watchdog, which printed why:
    assert "ProcessFailure: Process 1 failed (RuntimeError: boom at step 3) while process 0 of 2 was" in log
    assert "a failed process keeps the process group open" in log


@pytest.mark.distributed
def test_a_hanging_process_stops_the_others_after_ddp_timeout(tmp_path):
    results, log = _run(tmp_path, "--fail", "hang", "--step", "3", "--timeout", "5")
    survivor = results.get(0)
    assert survivor is not None and survivor["error"] == "ProcessFailure", log[-5000:]
    assert "Process 1 stopped without a word" in survivor["message"] and "stopped responding" in survivor["message"]
    assert survivor["seconds"] < 100


# ---------------------------------------------------------------------------------------------- no processes
def _traceback_through(*names: str) -> types.TracebackType:
    """A traceback whose trainwell frames are ``names`` (outermost first)."""
    namespace: dict = {"__name__": "trainwell.fake"}
    source = "\n".join(f"def {name}():\n    {callee}()" for name, callee in zip(names, [*names[1:], "fail"]))
    exec(source + "\ndef fail():\n    raise RuntimeError('x')\n", namespace)  # noqa: S102 - frames with these names
    try:
        namespace[names[0]]()
    except RuntimeError as err:
        return err.__traceback__
    raise AssertionError("unreachable")


def test_the_operation_is_read_from_trainwell_frames():
    from trainwell.backend.failures import describe_operation

    assert describe_operation(_traceback_through("run_window", "backward"), 4) == (
        "the backward pass (its gradient all-reduce) in training step 5")
    assert describe_operation(_traceback_through("maybe_log_save_evaluate", "save_checkpoint", "wait_for_everyone",
                                                 "gather"), 6) == (
        "waiting for the other processes (a barrier) while saving checkpoint-6")
    assert describe_operation(_traceback_through("evaluation_loop", "_gather_tensor", "gather"), 2) == (
        "gathering evaluation outputs in an evaluation at step 2")
    assert describe_operation(_traceback_through("something_else"), 1) == "in fail"


def test_communication_errors_are_told_from_other_errors():
    from trainwell.backend.failures import is_communication_error

    gloo = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1"
    assert is_communication_error(RuntimeError(gloo))
    assert is_communication_error(RuntimeError("[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms"))
    assert not is_communication_error(RuntimeError("shape mismatch"))
    assert not is_communication_error(ValueError("Connection closed by peer"))
