"""Two simulated nodes on one machine: ``torchrun --nnodes 2 --rdzv_backend c10d`` started twice, each from its own
working directory (two "disks") or both from one (a shared disk), running ``tests/distributed/multinode_script.py``.

Used by tests/test_multinode.py and benchmarks/reliability_multinode.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "distributed" / "multinode_script.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Launch:
    """What one two-node launch left: each agent's exit code and output, each process's report (by rank)."""

    returncodes: list[int]
    agent_logs: list[str]
    reports: dict[int, dict]
    process_logs: dict[int, str]

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes)

    def explain(self) -> str:
        """Everything the launch printed, for an assertion message."""
        parts = [f"--- agent {i} (rc {rc}):\n{log[-3000:]}" for i, (rc, log) in
                 enumerate(zip(self.returncodes, self.agent_logs))]
        parts += [f"--- process {rank}:\n{log[-3000:]}" for rank, log in sorted(self.process_logs.items())]
        return "\n".join(parts)

    def by_cwd(self, folder: Path) -> list[dict]:
        """The reports of the processes that ran in ``folder`` (one node's, on separate disks)."""
        return [r for _, r in sorted(self.reports.items()) if Path(r["cwd"]) == folder.resolve()]


def launch_two_nodes(nodes: tuple[Path, Path], report: Path, *flags: str, nproc: int = 1, timeout: float = 240,
                     static_ranks: tuple[int, int] | None = None, max_restarts: int = 0) -> Launch:
    """Start the two nodes (node i in ``nodes[i]``, which may be the same folder) and wait for both.

    The c10d rendezvous numbers the nodes as they join (``--node_rank`` is ignored); ``static_ranks`` uses the
    static rendezvous instead, with these node ranks (to renumber the nodes on purpose). ``max_restarts``: torchrun
    restarts every node's processes after a failure, up to that many times.
    """
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    report.mkdir(parents=True, exist_ok=True)
    procs = []
    for node, folder in enumerate(nodes):
        folder.mkdir(parents=True, exist_ok=True)
        rendezvous = ["--node_rank", str(node), "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}"]
        if static_ranks is not None:
            rendezvous = ["--node_rank", str(static_ranks[node]), "--rdzv_backend", "static", "--master_addr",
                          "127.0.0.1", "--master_port", str(port)]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", str(nproc),
               *rendezvous, "--max_restarts", str(max_restarts), str(SCRIPT), "--report", str(report), *flags]
        procs.append(subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    logs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            out, _ = proc.communicate()
            out += "\n[timed out]"
        logs.append(out)
    return Launch([p.returncode for p in procs], logs, *_read_reports(report, 2 * nproc))


def launch_one_node(folder: Path, report: Path, *flags: str, rendezvous: str = "static", nproc: int = 2,
                    max_restarts: int = 0, timeout: float = 240) -> Launch:
    """``torchrun --nproc_per_node nproc`` in ``folder`` with the ``static`` (torchrun's default: ``--master_addr``,
    ``--master_port``) or ``c10d`` rendezvous, ``--max-restarts max_restarts``; waits for it (killed after
    ``timeout`` seconds: the log then ends with ``[timed out]``)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    report.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    if rendezvous == "static":
        meet = ["--master_addr", "127.0.0.1", "--master_port", str(port)]
    else:
        meet = ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "restart-test"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc), *meet,
           "--max_restarts", str(max_restarts), str(SCRIPT), "--report", str(report), *flags]
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *descendants(proc.pid)]:  # torchrun starts its processes in sessions of their own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += "\n[timed out]"
    return Launch([proc.returncode], [out], *_read_reports(report, nproc))


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, queue = [], list(children.get(pid, []))
    while queue:
        found.append(queue.pop(0))
        queue += children.get(found[-1], [])
    return found


def _read_reports(report: Path, processes: int) -> tuple[dict[int, dict], dict[int, str]]:
    reports, process_logs = {}, {}
    for rank in range(processes):
        if (report / f"rank{rank}.json").is_file():
            reports[rank] = json.loads((report / f"rank{rank}.json").read_text())
        if (report / f"rank{rank}.log").is_file():
            process_logs[rank] = (report / f"rank{rank}.log").read_text()
    return reports, process_logs


def files_under(folder: Path) -> list[str]:
    """Every file under ``folder``, relative and sorted (a node's disk, as the test lists it)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def writes_by_path(reports: dict[int, dict]) -> dict[str, set[int]]:
    """Absolute path -> the processes that wrote it (opened it for writing, or renamed something onto it)."""
    writers: dict[str, set[int]] = {}
    for rank, report in reports.items():
        for what, path in report.get("writes", []):
            if what in ("write", "rename-to"):
                writers.setdefault(os.path.join(report["cwd"], path), set()).add(rank)
    return writers
