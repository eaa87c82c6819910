"""The decisions behind multi-node runs, without launching processes: joining the launcher's CPU processes into one
job, which processes see which writer's output_dir, and which checkpoint all processes resume.

Several "processes" are simulated by threads with an all-gather over a barrier; tests/test_multinode.py runs the
real thing under torchrun.
"""

from __future__ import annotations

import logging
import shutil
import threading
from types import SimpleNamespace

import pytest

from tests.common.models import RegressionDataset, RegressionModel
from tests.common.timing import hang_timeout
from tests.conftest import make_args
from trainwell import Trainer
from trainwell.args.launcher import accelerate_cpu
from trainwell.checkpoint import disks
from trainwell.checkpoint.resume import Resume


class Processes:
    """``n`` threads standing for processes, with an all-gather between them."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.slots: list = [None] * n
        self.barrier = threading.Barrier(n)
        self.local = threading.local()

    def gather(self, obj):
        self.slots[self.local.rank] = obj
        self.barrier.wait()
        gathered = list(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return gathered

    def run(self, work) -> list:
        """``work(rank)`` on every process; each one's result, or the exception it raised."""
        results: list = [None] * self.n

        def one(rank: int) -> None:
            self.local.rank = rank
            try:
                results[rank] = work(rank)
            except Exception as err:  # noqa: BLE001 - compared by the test
                results[rank] = err

        threads = [threading.Thread(target=one, args=(rank,)) for rank in range(self.n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=hang_timeout(60))
        return results


# ---------------------------------------------------------------------------------------------- joining processes
def _args(use_cpu: bool = False, **kwargs):
    return make_args("out", use_cpu=use_cpu, **kwargs)


@pytest.mark.parametrize("world,use_cpu,expected", [("2", False, True), ("2", True, True), (None, False, False),
                                                    ("1", False, False)])
def test_launched_cpu_processes_are_joined(monkeypatch, world, use_cpu, expected):
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the device is the GPU")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    assert accelerate_cpu(_args(use_cpu)) is expected


def test_engines_keep_their_own_process_setup(monkeypatch):
    """FSDP and DeepSpeed are dropped by Accelerate under cpu=True: they are left to Accelerate's own choice."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert accelerate_cpu(_args()) is False
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "1")
    assert accelerate_cpu(_args()) is False


def test_processes_left_alone_by_accelerate_are_refused(monkeypatch):
    from accelerate.utils import DistributedType

    from trainwell.backend.engines import _check_processes_joined

    monkeypatch.setenv("WORLD_SIZE", "4")
    alone = SimpleNamespace(num_processes=1, distributed_type=DistributedType.NO, device=SimpleNamespace(type="mps"))
    with pytest.raises(RuntimeError, match=r"started 4 processes .* train alone .*pass use_cpu=True"):
        _check_processes_joined(_args(), alone)
    alone.device.type = "cpu"
    with pytest.raises(RuntimeError, match=r"DeepSpeed joins CPU processes over gloo only: pass ddp_backend='gloo'"):
        _check_processes_joined(SimpleNamespace(deepspeed={"zero_optimization": {}}, output_dir="out"), alone)
    joined = SimpleNamespace(num_processes=4)
    _check_processes_joined(_args(), joined)  # one job: nothing to say


# ---------------------------------------------------------------------------------------------- disks
def _probe(tmp_path, folders: list[str], writers: list[int]) -> list:
    procs = Processes(len(folders))
    return procs.run(lambda rank: disks.probe(str(tmp_path / folders[rank] / "out"), rank in writers, procs.gather))


def test_probe_tells_shared_from_node_local_disks(tmp_path):
    shared = _probe(tmp_path, ["a", "a", "a", "a"], writers=[0, 2])  # two nodes' main processes, one disk
    assert all(d == shared[0] for d in shared) and shared[0].shared_writers() == [0, 2] and shared[0].blind() == []
    local = _probe(tmp_path, ["a", "a", "b", "b"], writers=[0, 2])
    assert local[0].sees == ((0,), (0,), (2,), (2,)) and local[0].shared_writers() == [] and local[0].blind() == []
    one_writer = _probe(tmp_path, ["a", "a", "b", "b"], writers=[0])
    assert one_writer[0].blind() == [2, 3]
    assert sorted(p.name for p in (tmp_path / "a" / "out").iterdir()) == []  # the probe files are gone


def test_check_refuses_two_writers_on_one_disk():
    placement = disks.Disks(writers=(0, 2), sees=((0, 2),) * 4)
    with pytest.raises(ValueError, match=r"save_on_each_node=True, but processes 0, 2 .* see the same output_dir "
                                         r"\(out\).*Set save_on_each_node=False"):
        disks.check(placement, _args(save_on_each_node=True), every_process_writes=False, is_main=True)


def test_check_refuses_a_copy_per_node_of_a_sharded_checkpoint():
    placement = disks.Disks(writers=(0, 2), sees=((0,), (0,), (2,), (2,)))
    disks.check(placement, _args(save_on_each_node=True), every_process_writes=False, is_main=True)  # DDP: fine
    with pytest.raises(ValueError, match=r"save_on_each_node=True with FSDP or tensor parallelism.*a copy on each "
                                         r"node would be incomplete"):
        disks.check(placement, _args(save_on_each_node=True), every_process_writes=True, is_main=True,
                    one_folder=True)


def test_check_on_disks_the_writer_alone_sees(caplog):
    placement = disks.Disks(writers=(0,), sees=((0,), (0,), (), ()))
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        disks.check(placement, _args(), every_process_writes=False, is_main=True)
    assert "Processes 2, 3 do not see the output_dir (out) that process 0 writes checkpoints into" in caplog.text
    assert "save_on_each_node=True" in caplog.text
    with pytest.raises(ValueError, match="every process writes its shards"):
        disks.check(placement, _args(), every_process_writes=True, is_main=True)
    with pytest.raises(ValueError, match="load_best_model_at_end=True reloads the best checkpoint on every process"):
        disks.check(placement, _args(load_best_model_at_end=True, eval_strategy="steps", save_strategy="steps"),
                    every_process_writes=False, is_main=True)


# ---------------------------------------------------------------------------------------------- resume
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A run's output_dir with checkpoint-2 and checkpoint-4."""
    out = tmp_path_factory.mktemp("run") / "out"
    args = make_args(str(out), max_steps=4, save_strategy="steps", save_steps=2, per_device_train_batch_size=4,
                     learning_rate=0.1)
    Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=32)).train()
    return out


def _disk(tmp_path, name, checkpoints, steps):
    out = tmp_path / name / "out"
    out.mkdir(parents=True)
    for step in steps:
        shutil.copytree(checkpoints / f"checkpoint-{step}", out / f"checkpoint-{step}")
    return str(out)


def _resume_on(outs: list[str], resume_from_checkpoint=True) -> list:
    procs = Processes(len(outs))
    return procs.run(lambda rank: Resume.find(resume_from_checkpoint, outs[rank], True, procs.gather))


def test_processes_resume_the_newest_checkpoint_they_all_have(tmp_path, checkpoints, caplog):
    """Node 1 died before publishing checkpoint-4 on its own disk: both resume checkpoint-2."""
    outs = [_disk(tmp_path, "a", checkpoints, (2, 4)), _disk(tmp_path, "b", checkpoints, (2,))]
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        found = _resume_on(outs)
    assert [r.path for r in found] == [f"{outs[0]}/checkpoint-2", f"{outs[1]}/checkpoint-2"]
    assert "newest checkpoints differ" in caplog.text and "resuming checkpoint-2" in caplog.text


def test_a_process_without_the_checkpoint_stops_every_process(tmp_path, checkpoints):
    outs = [_disk(tmp_path, "a", checkpoints, (2, 4)), _disk(tmp_path, "b", checkpoints, ())]
    errors = _resume_on(outs)
    assert all(isinstance(e, ValueError) for e in errors) and str(errors[0]) == str(errors[1])
    assert "Process 1: resume_from_checkpoint=True but no complete checkpoint was found" in str(errors[0])
    assert "save_on_each_node=True" in str(errors[0]) and "copy the checkpoint folder" in str(errors[0])
    named = _resume_on(outs, resume_from_checkpoint="out/checkpoint-4")  # relative: not there for either thread
    assert all(isinstance(e, ValueError) for e in named)


def test_processes_that_agree_resume_without_a_word(tmp_path, checkpoints, caplog):
    outs = [_disk(tmp_path, "a", checkpoints, (2, 4)), _disk(tmp_path, "b", checkpoints, (2, 4))]
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        found = _resume_on(outs)
    assert [r.path for r in found] == [f"{out}/checkpoint-4" for out in outs]
    assert "differ" not in caplog.text


def test_processes_that_disagree_on_resuming_stop_together(tmp_path, checkpoints):
    """get_last_checkpoint(output_dir) on node-local disks: a checkpoint on one node, none on the other. The process
    without one must not start training while the other waits in the resume."""
    outs = [_disk(tmp_path, "a", checkpoints, (2, 4)), _disk(tmp_path, "b", checkpoints, ())]
    procs = Processes(2)
    given = [f"{outs[0]}/checkpoint-4", None]
    errors = procs.run(lambda rank: Resume.find(given[rank], outs[rank], True, procs.gather))
    assert all(isinstance(e, ValueError) for e in errors) and str(errors[0]) == str(errors[1])
    assert "resumes" in str(errors[0]) and "but not on process 1" in str(errors[0])
    assert "pass resume_from_checkpoint=True on every process" in str(errors[0])
    assert procs.run(lambda rank: Resume.find(None, outs[rank], True, procs.gather)) == [None, None]


def test_explicit_newest_checkpoints_that_differ_resume_the_older(tmp_path, checkpoints):
    outs = [_disk(tmp_path, "a", checkpoints, (2, 4)), _disk(tmp_path, "b", checkpoints, (2,))]
    procs = Processes(2)
    given = [f"{outs[0]}/checkpoint-4", f"{outs[1]}/checkpoint-2"]
    found = procs.run(lambda rank: Resume.find(given[rank], outs[rank], True, procs.gather))
    assert [r.path for r in found] == [f"{outs[0]}/checkpoint-2", f"{outs[1]}/checkpoint-2"]
