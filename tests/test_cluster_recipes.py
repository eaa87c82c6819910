"""docs/scaling.md's cluster recipes run as written, as far as one machine without Slurm or Kubernetes can run them.

* The ``sbatch`` script, taken from the page, runs under bash with ``SLURM_*`` variables set and stand-ins for
  ``scontrol`` and ``srun`` on the ``PATH`` (``srun`` runs its command; ``scontrol`` names this machine and records a
  requeue): 2 CPU processes of ``examples/cluster_train.py`` train to the end; sent SIGTERM mid-run (what
  ``--signal=B:TERM@300`` does before the time limit), every process saves, the script asks Slurm to requeue the
  job, and run again it resumes and ends bit-equal to the uninterrupted run.
* The Kubernetes manifest parses, and the command of its container is the torchrun command line the ``sbatch``
  script runs (the one tested above), with the Slurm variables filled in as the manifest's values.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.common.multinode import descendants, free_port
from tests.common.timing import hang_timeout

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "scaling.md"
SHORT = ("--save_steps 500", "--save_steps 100 --max_steps 1000 --logging_steps 100")  # a short run here


def _block(language: str, marker: str) -> str:
    """The page's fenced ``language`` block that contains ``marker``."""
    blocks = re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, f"{DOC} has {len(found)} ```{language} blocks with {marker!r}"
    return found[0]


def _sbatch() -> str:
    return _block("bash", "#SBATCH --requeue")


def _stand_ins(folder: Path, srun: str, head: str) -> Path:
    """A folder of ``scontrol`` and ``srun`` stand-ins to put first on the ``PATH``."""
    folder.mkdir(exist_ok=True)
    (folder / "scontrol").write_text(f'#!/bin/bash\ncase "$1" in\n  show) echo {head} ;;\n'
                                     '  requeue) echo "requeue $2" >> "$SCONTROL_LOG" ;;\nesac\n')
    (folder / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == -* ]]; do shift; done\n' + srun)
    for name in ("scontrol", "srun"):
        (folder / name).chmod(0o755)
    return folder


def _environment(tmp_path: Path, nodes: int, job: str) -> dict[str, str]:
    bin_dir = _stand_ins(tmp_path / "bin", 'exec "$@"\n' if nodes == 1 else 'printf "%s\\n" "$@" > "$ARGS"\n',
                         "localhost" if nodes == 1 else "train-0.train")
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {**os.environ, "PATH": path, "SLURM_JOB_NODELIST": "node-[1-2]", "SLURM_NNODES": str(nodes),
           "SLURM_JOB_ID": job, "SCONTROL_LOG": str(tmp_path / "scontrol.log"), "ARGS": str(tmp_path / "args"),
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    for name in ("GPUS_PER_NODE", "RDZV_PORT", "OUTPUT_DIR"):
        env.pop(name, None)
    return env


def _start(folder: Path, port: int) -> subprocess.Popen:
    """The page's sbatch script, short, in ``folder`` (with ``train.py`` = examples/cluster_train.py), 2 processes."""
    script = _sbatch()
    assert SHORT[0] in script
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.sbatch").write_text(script.replace(*SHORT))
    (folder / "train.py").write_text((ROOT / "examples" / "cluster_train.py").read_text())
    env = {**_environment(folder, nodes=1, job="4242"), "GPUS_PER_NODE": "2", "RDZV_PORT": str(port),
           "OUTPUT_DIR": str(folder / "run")}
    return subprocess.Popen(["bash", "train.sbatch"], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, seconds: float = 120) -> str:
    try:
        return proc.communicate(timeout=hang_timeout(seconds))[0]
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *descendants(proc.pid)]:  # bash, torchrun and its processes
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return proc.communicate()[0] + "\n[timed out]"


def _weights(folder: Path) -> bytes:
    return (folder / "run" / "checkpoint-1000" / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> bytes:
    folder = tmp_path_factory.mktemp("uninterrupted")
    proc = _start(folder, free_port())
    log = _finish(proc)
    assert proc.returncode == 0, log[-5000:]
    assert not (folder / "scontrol.log").exists()  # finished: no requeue
    return _weights(folder)


@pytest.mark.distributed
def test_the_sbatch_script_saves_on_sigterm_requeues_and_resumes_exactly(tmp_path: Path, uninterrupted: bytes) -> None:
    proc = _start(tmp_path, free_port())
    deadline = time.monotonic() + hang_timeout(100)
    while not (tmp_path / "run" / "checkpoint-100").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)  # Slurm's --signal=B:TERM@300, to the batch script
    log = _finish(proc)
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n", log[-5000:]
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "run").glob("checkpoint-*"))
    assert saved and 100 <= saved[-1] < 1000, (saved, log[-5000:])  # the step under way when the signal came
    (tmp_path / "scontrol.log").unlink()
    first = tmp_path / "run" / "checkpoint-100" / "model.safetensors"
    written = first.stat().st_mtime_ns
    again = _start(tmp_path, free_port())  # the requeued job: the same script, the same job id
    log = _finish(again)
    assert again.returncode == 0, log[-5000:]
    assert first.stat().st_mtime_ns == written  # resumed, not started over (which would write checkpoint-100 again)
    assert _weights(tmp_path) == uninterrupted


def test_the_kubernetes_manifest_runs_the_tested_torchrun_command(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    service, job = yaml.safe_load_all(_block("yaml", "kind: Job"))
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    pods = job["spec"]["completions"]
    assert job["spec"]["parallelism"] == pods and job["spec"]["template"]["spec"]["subdomain"] == service["metadata"][
        "name"] == "train"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    # the sbatch script's torchrun line, expanded by bash with the manifest's values: 2 nodes, pod 0's name
    (tmp_path / "train.sbatch").write_text(_sbatch())
    env = _environment(tmp_path, nodes=pods, job=job["metadata"]["name"])
    done = subprocess.run(["bash", "train.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=hang_timeout(30))
    assert done.returncode == 0, done.stderr
    assert container["command"] == (tmp_path / "args").read_text().splitlines(), json.dumps(container["command"])
