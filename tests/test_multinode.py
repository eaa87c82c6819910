"""Two simulated nodes on one machine (torchrun --nnodes 2, c10d rendezvous, gloo): one job, one writer per file,
complete checkpoints where each resume reads them, and an exact resume after one node is killed.

Each node runs from its own working directory (a relative output_dir lands on two separate "disks") or both run
from one (a shared disk). The uninterrupted run is the one every killed-and-resumed run must end equal to, bit for
bit. The runs use the tiny dropout MLP of tests/common/models.py, 6 steps, a checkpoint every 2.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.common.multinode import files_under, free_port, launch_two_nodes, writes_by_path
from tests.common.timing import hang_timeout

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT_FILES = ["checkpoint_manifest.json", "model.safetensors", "optimizer.pt", "rng_state_0.pth",
                    "rng_state_1.pth", "scheduler.pt", "trainer_state.json", "training_args.json"]


def _cpu_only() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("simulated nodes: CPU processes over gloo")


def _checkpoints(folder: Path) -> dict[str, list[str]]:
    """checkpoint-N -> its files, under ``folder/out``."""
    out = folder / "out"
    return {p.name: files_under(p) for p in sorted(out.glob("checkpoint-*"))} if out.is_dir() else {}


def _no_file_written_twice(*launches) -> None:
    for launch in launches:
        shared = {path: ranks for path, ranks in writes_by_path(launch.reports).items() if len(ranks) > 1}
        assert not shared, f"files written by more than one process: {shared}"


def _assert_same_run(resumed, full) -> None:
    """Every process of ``resumed`` ends with the uninterrupted run's weights and logged losses, bit for bit."""
    assert resumed.ok, resumed.explain()
    for rank, report in resumed.reports.items():
        assert report["step"] == 6
        assert report["params"] == full.reports[0]["params"], f"process {rank}"
        assert report["losses"] == full.reports[0]["losses"], f"process {rank}"


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The uninterrupted run: both nodes in one folder, with use_cpu=False (what a GPU script passes)."""
    _cpu_only()
    root = tmp_path_factory.mktemp("full")
    run = launch_two_nodes((root / "disk", root / "disk"), root / "report", "--no-use-cpu")
    assert run.ok, run.explain()
    run.folder = root / "disk"
    return run


def test_two_nodes_train_as_one_job_on_a_shared_disk(full):
    """use_cpu=False on a machine without GPUs: Accelerate used to set each process up alone (every process world
    process zero, N copies training side by side); the launcher's processes are one job now."""
    for rank, report in full.reports.items():
        assert report["world_size"] == 2 and report["process_index"] == rank
        assert report["is_world_zero"] is report["state_world_zero"] is (rank == 0)
        assert report["is_local_zero"] is report["state_local_zero"] is True  # one process per node
    assert full.reports[0]["params"] == full.reports[1]["params"]
    # only world process zero writes into the shared output_dir, every process's RNG state included
    assert _checkpoints(full.folder) == {f"checkpoint-{s}": CHECKPOINT_FILES for s in (2, 4, 6)}
    written = writes_by_path(full.reports)
    assert written and all(ranks == {0} for ranks in written.values()), written
    # log_on_each_node=True: each node's main process logs at log_level; the log dicts are printed once
    assert all(r["log_level"] == logging.INFO for r in full.reports.values())
    assert all("an info line from process" in full.process_logs[rank] for rank in (0, 1))
    assert "{'loss'" in full.process_logs[0] and "{'loss'" not in full.process_logs[1]


def test_node_local_disks_with_save_on_each_node_resume_exactly(tmp_path, full):
    """Separate disks, save_on_each_node=True: each node's main process writes a complete checkpoint (every
    process's RNG state in each copy) on its own disk. Process 1 is killed at step 5; both nodes restart and
    resume checkpoint-4 to the uninterrupted run's weights and losses."""
    nodes = (tmp_path / "node0", tmp_path / "node1")
    killed = launch_two_nodes(nodes, tmp_path / "killed", "--each", "--kill-rank", "1", "--kill-step", "5")
    assert not killed.ok and killed.reports[1]["killed_at"] == 5, killed.explain()
    for node in nodes:
        assert _checkpoints(node) == {f"checkpoint-{s}": CHECKPOINT_FILES for s in (2, 4)}, files_under(node)
        (writer,) = [r for r in killed.by_cwd(node) if r["is_local_zero"]]
        written = {p for what, p in writer["writes"] if what == "write"}
        # each node's writer wrote both of its processes' RNG files (through the one write helper: a fresh name in
        # the folder, opened relative to its descriptor, then renamed)
        assert all(any(re.fullmatch(rf"(out/\.tmp-checkpoint-4/)?\.?rng_state_{r}\.pth(\.[0-9a-f]+\.tmp)?", p)
                       for p in written) for r in (0, 1)), written
    resumed = launch_two_nodes(nodes, tmp_path / "resumed", "--each", "--resume")
    _assert_same_run(resumed, full)
    _no_file_written_twice(killed, resumed)
    for node in nodes:
        assert _checkpoints(node) == {f"checkpoint-{s}": CHECKPOINT_FILES for s in (2, 4, 6)}


def test_shared_disk_resumes_exactly_after_a_node_is_killed(tmp_path, full):
    folder = tmp_path / "disk"
    killed = launch_two_nodes((folder, folder), tmp_path / "killed", "--kill-rank", "1", "--kill-step", "5")
    assert not killed.ok and killed.reports[1]["killed_at"] == 5, killed.explain()
    assert _checkpoints(folder) == {f"checkpoint-{s}": CHECKPOINT_FILES for s in (2, 4)}
    resumed = launch_two_nodes((folder, folder), tmp_path / "resumed", "--resume")
    _assert_same_run(resumed, full)
    _no_file_written_twice(killed, resumed)


def _writer_and_other(run, nodes: tuple[Path, Path]) -> tuple[Path, Path]:
    """(world process zero's disk, the other one): the c10d rendezvous numbers the nodes as they join."""
    writer_disk = Path(run.reports[0]["cwd"])
    return writer_disk, nodes[1] if writer_disk == nodes[0].resolve() else nodes[0]


def test_node_local_disks_with_one_writer(tmp_path, full):
    """Separate disks, save_on_each_node=False: the processes of the other node used to write their RNG state into
    a checkpoint folder that exists only on process 0's disk, and the run died at its first save. Now world process
    zero writes every process's RNG state, the checkpoints are complete on its disk, the other node writes nothing
    and gets a warning. log_on_each_node=False: only world process zero logs at log_level."""
    nodes = (tmp_path / "node0", tmp_path / "node1")
    run = launch_two_nodes(nodes, tmp_path / "report", "--log-each", "0")
    assert run.ok, run.explain()
    writer_disk, other_disk = _writer_and_other(run, nodes)
    assert _checkpoints(writer_disk) == {f"checkpoint-{s}": CHECKPOINT_FILES for s in (2, 4, 6)}
    assert _checkpoints(other_disk) == {}
    assert not [w for w in run.reports[1]["writes"] if w[0] == "write"]
    assert "does not see the output_dir (out)" in run.process_logs[0]
    assert "save_on_each_node=True" in run.process_logs[0]
    assert [run.reports[r]["log_level"] for r in (0, 1)] == [logging.INFO, logging.ERROR]
    assert "an info line" in run.process_logs[0] and "an info line" not in run.process_logs[1]
    assert all(r["params"] == full.reports[0]["params"] for r in run.reports.values())


def test_node_local_disks_with_one_writer_resume_without_a_copy(tmp_path, full):
    """Separate disks, save_on_each_node=False: only world process zero's disk holds checkpoint-4 when process 1 is
    killed. The restart resumes without anyone copying folders: the process whose disk lacks the checkpoint receives
    it over the process group (trainwell.checkpoint.fetch), checked against the manifest, and the run ends bit-equal
    to the shared-disk run. Twice: with the writer's node numbered 0 again, and numbered 1 (a restart may renumber
    the nodes), when the sender is the lowest-ranked process that has the checkpoint."""
    nodes = (tmp_path / "node0", tmp_path / "node1")
    killed = launch_two_nodes(nodes, tmp_path / "killed", "--kill-rank", "1", "--kill-step", "5")
    assert not killed.ok and killed.reports[1]["killed_at"] == 5, killed.explain()
    writer_disk, other_disk = _writer_and_other(killed, nodes)
    assert _checkpoints(writer_disk) == {f"checkpoint-{s}": CHECKPOINT_FILES for s in (2, 4)}
    assert _checkpoints(other_disk) == {}
    renumbered = (tmp_path / "again0", tmp_path / "again1")  # the same disks, for the restart that renumbers
    for node, copy in zip(nodes, renumbered):
        shutil.copytree(node, copy)

    writer_first = (0, 1) if writer_disk == nodes[0].resolve() else (1, 0)
    resumed = launch_two_nodes(nodes, tmp_path / "resumed", "--resume", static_ranks=writer_first)
    _assert_same_run(resumed, full)
    _no_file_written_twice(killed, resumed)
    assert "Sending out/checkpoint-4 from process 0 to processes 1" in resumed.process_logs[0]
    assert _checkpoints(other_disk) == {"checkpoint-4": CHECKPOINT_FILES}  # the fetched copy, complete

    swapped = launch_two_nodes(renumbered, tmp_path / "swapped", "--resume", static_ranks=writer_first[::-1])
    _assert_same_run(swapped, full)
    assert "Sending out/checkpoint-4 from process 1 to processes 0" in swapped.process_logs[1]


def test_save_on_each_node_on_a_shared_disk_is_refused(tmp_path):
    folder = tmp_path / "disk"
    run = launch_two_nodes((folder, folder), tmp_path / "report", "--each")
    assert not run.ok
    for report in run.reports.values():
        assert report["error"] == "ValueError"
        assert "see the same output_dir (out)" in report["message"]
        assert "Set save_on_each_node=False" in report["message"]
    assert _checkpoints(folder) == {}


def test_two_nodes_of_two_processes_on_local_disks(tmp_path):
    """2 nodes x 2 processes, separate disks, save_on_each_node=True: local process zero of each node writes, the
    others write nothing; process 3 (node 1's second) is killed, and the restart ends equal to the uninterrupted
    run.

    With more than 2 processes a sum of gradients depends on its order, and DDP lays its gradient buckets out again
    after each process's first step: the first step after a restart sums in another order than the uninterrupted
    run did at that step (the last bit of a few weights differs). ddp_find_unused_parameters=True keeps DDP's first
    layout, and the resume is bit-exact.
    """
    _cpu_only()
    shared = tmp_path / "shared"
    full = launch_two_nodes((shared, shared), tmp_path / "full", "--find-unused", nproc=2)
    assert full.ok, full.explain()
    for rank, report in full.reports.items():
        assert report["world_size"] == 4 and report["process_index"] == rank
        assert report["local_process_index"] == rank % 2
        assert report["is_world_zero"] is (rank == 0) and report["is_local_zero"] is (rank % 2 == 0)
    nodes = (tmp_path / "node0", tmp_path / "node1")
    killed = launch_two_nodes(nodes, tmp_path / "killed", "--each", "--find-unused", "--kill-rank", "3", "--kill-step",
                              "5", nproc=2)
    assert not killed.ok and killed.reports[3]["killed_at"] == 5, killed.explain()
    files = CHECKPOINT_FILES + ["rng_state_2.pth", "rng_state_3.pth"]
    for node in nodes:
        assert _checkpoints(node) == {f"checkpoint-{s}": sorted(files) for s in (2, 4)}
        for report in killed.by_cwd(node):
            wrote = [w for w in report["writes"] if w[0] == "write" and "checkpoint" in w[1]]
            assert bool(wrote) is report["is_local_zero"], report["rank"]
    resumed = launch_two_nodes(nodes, tmp_path / "resumed", "--each", "--find-unused", "--resume", nproc=2)
    assert resumed.ok, resumed.explain()
    for report in resumed.reports.values():
        assert report["params"] == full.reports[0]["params"] and report["losses"] == full.reports[0]["losses"]
    _no_file_written_twice(full, killed, resumed)


def test_the_docs_localhost_recipe_trains_the_quickstart_as_one_job_of_two_nodes(tmp_path):
    """docs/scaling.md's "Several nodes on one machine", run as written (on a free port, this Python's torchrun):
    the two launchers make one job of 2 processes, so the quickstart's epoch is 32 steps (3 epochs: checkpoint-96)
    and each checkpoint holds both processes' RNG state."""
    _cpu_only()
    doc = (ROOT / "docs" / "scaling.md").read_text("utf-8")
    (block,) = re.findall(r"```bash\n(.*?)```", doc[doc.index("## Several nodes on one machine"):].split("\n## ")[0],
                          re.S)  # fmt: skip
    # the venv's torchrun, as pasted from a clone: a bare `torchrun` is "command not found" outside the venv
    assert block.count("127.0.0.1:29500") == 1 and block.count(".venv/bin/torchrun ") == 1, block
    script = block.replace("127.0.0.1:29500", f"127.0.0.1:{free_port()}")
    script = script.replace(".venv/bin/torchrun ", f"{shlex.quote(sys.executable)} -m torch.distributed.run ")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=hang_timeout(400))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # both launchers and their processes, not only bash
        out = proc.communicate()[0] + "\n[timed out]"
    logs = "".join(f"--- node{n}.log\n" + (tmp_path / f"node{n}.log").read_text()[-3000:] for n in (0, 1)
                   if (tmp_path / f"node{n}.log").is_file())  # fmt: skip
    assert proc.returncode == 0, out[-3000:] + logs
    checkpoint = tmp_path / "quickstart-out" / "checkpoint-96"
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(os.listdir(checkpoint)), logs
    assert not (tmp_path / "quickstart-out" / "checkpoint-192").exists()
    for node in (0, 1):  # each node's process printed the quickstart's evaluation and predictions
        text = (tmp_path / f"node{node}.log").read_text()
        assert "'eval_accuracy'" in text and "predicted: [" in text, text[-3000:]
