"""Two simulated nodes on one machine, run the same way with both libraries: is it one job, does any file get two
writers, and does a run killed on one node resume exactly?

Each run is ``torchrun --nnodes 2 --nproc_per_node 1`` started twice (``tests/common/multinode.py``), from one
working directory (a shared disk) or from two (a relative ``output_dir`` on each node's own disk), training
``tests/distributed/multinode_script.py`` (a dropout MLP, 6 steps, a checkpoint every 2) on CPUs over gloo. A kill
SIGKILLs process 1 at the end of step 5; the restart passes ``resume_from_checkpoint=True`` (the reference looks up
``get_last_checkpoint(output_dir)``, the same thing). "Exact" compares the final weights of every process with
the library's own uninterrupted run, bit for bit. Files written by more than one process come from an audit hook in
each process (opens for writing and renames under the working directory).

Scenarios:

* ``one-job``: shared disk, ``use_cpu=False`` (what a script written for GPUs passes): how many processes think
  they are world process zero, files with two writers, weights against the uninterrupted ``use_cpu=True`` run.
* ``local-disks``: separate disks, ``save_on_each_node=False``; killed, restarted as is; then world process zero's
  ``checkpoint-4`` is copied (merged) onto the other disk, as a user would, and restarted again.
* ``local-disks-each``: separate disks, ``save_on_each_node=True``; killed, restarted with the nodes numbered the
  other way round (the static rendezvous with swapped ``--node_rank``: what c10d may do on a restart).
* ``shared-disk-each``: shared disk, ``save_on_each_node=True``: files with two writers, outcome.

    .venv/bin/python benchmarks/reliability_multinode.py [--library trainwell|transformers|both] [--only NAME]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.common.multinode import launch_two_nodes, writes_by_path  # noqa: E402

KILL = ("--kill-rank", "1", "--kill-step", "5")


def _error(launch) -> str:
    """The error that says why: a process's own, before the others' communication errors that followed it."""
    errors = [r for r in launch.reports.values() if r.get("error")]
    errors.sort(key=lambda r: r["error"] in ("RuntimeError", "ProcessFailure", "DistBackendError"))
    for report in errors:
        return f"{report['error']}: {report['message'][:140]}"
    text = "\n".join(launch.process_logs.values())
    lines = [line for line in text.splitlines() if "Error" in line and not line.startswith("frame")]
    return lines[-1][:160] if lines else "failed"


def _exact(launch, baseline) -> str:
    if not launch.ok:
        return f"fails ({_error(launch)})"
    same = all(r.get("params") == baseline.reports[0]["params"] for r in launch.reports.values())
    return "exact" if same else "finishes, weights differ from the uninterrupted run"


def _collisions(*launches) -> int:
    return sum(len([p for p, ranks in writes_by_path(run.reports).items() if len(ranks) > 1]) for run in launches)


def one_job(root: Path, lib: tuple[str, ...], baseline) -> str:
    run = launch_two_nodes((root / "disk", root / "disk"), root / "report", *lib, "--no-use-cpu")
    zeros = sum(1 for r in run.reports.values() if r.get("is_world_zero"))
    same = all(r.get("params") == baseline.reports[0]["params"] for r in run.reports.values())
    return (f"{'ok' if run.ok else 'fails'}; {zeros} of 2 processes are world process zero; {_collisions(run)} files "
            f"written by 2 processes; weights {'equal' if same else 'differ from'} the one-job run's")


def local_disks(root: Path, lib: tuple[str, ...], baseline) -> str:
    nodes = (root / "node0", root / "node1")
    killed = launch_two_nodes(nodes, root / "killed", *lib, *KILL)
    restart = launch_two_nodes(nodes, root / "restart", *lib, "--resume")
    writer = Path(killed.reports[0]["cwd"])
    other = nodes[1] if writer == nodes[0].resolve() else nodes[0]
    shutil.copytree(writer / "out" / "checkpoint-4", other / "out" / "checkpoint-4", dirs_exist_ok=True)
    copied = launch_two_nodes(nodes, root / "copied", *lib, "--resume")
    return f"restart: {_exact(restart, baseline)}; after copying checkpoint-4: {_exact(copied, baseline)}"


def local_disks_each(root: Path, lib: tuple[str, ...], baseline) -> str:
    nodes = (root / "node0", root / "node1")
    launch_two_nodes(nodes, root / "killed", *lib, "--each", *KILL, static_ranks=(0, 1))
    swapped = launch_two_nodes(nodes, root / "swapped", *lib, "--each", "--resume", static_ranks=(1, 0))
    return f"restart with the nodes renumbered: {_exact(swapped, baseline)}"


def shared_disk_each(root: Path, lib: tuple[str, ...], baseline) -> str:
    run = launch_two_nodes((root / "disk", root / "disk"), root / "report", *lib, "--each")
    return f"{_exact(run, baseline)}; {_collisions(run)} files written by 2 processes"


SCENARIOS = {"one-job": one_job, "local-disks": local_disks, "local-disks-each": local_disks_each,
             "shared-disk-each": shared_disk_each}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--library", choices=("trainwell", "transformers", "both"), default="both")
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    cli = parser.parse_args()
    libraries = ["trainwell", "transformers"] if cli.library == "both" else [cli.library]
    with tempfile.TemporaryDirectory() as tmp:
        for library in libraries:
            lib = ("--lib", library)
            base = Path(tmp) / library / "baseline"
            baseline = launch_two_nodes((base, base), base / "report", *lib)
            assert baseline.ok, baseline.explain()
            for name in cli.only or SCENARIOS:
                print(f"{library:12s} {name:18s} {SCENARIOS[name](Path(tmp) / library / name, lib, baseline)}",
                      flush=True)


if __name__ == "__main__":
    main()
