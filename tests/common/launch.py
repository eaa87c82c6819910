"""Launching a test script once per named configuration (one process, or several under torchrun) and keeping
each result, for the multi-process test modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.common.timing import hang_timeout


class ScriptRuns:
    """Runs ``script`` with ``--out NAME.json --workdir FOLDER`` under ``root``, once per name; returns its JSON."""

    def __init__(self, script: str, root: Path) -> None:
        self.script, self.root = script, root
        self.results: dict[str, dict] = {}

    def workdir(self, name: str) -> Path:
        return self.root / name

    def __call__(self, name: str, processes: int, *flags: str, killed: bool = False, fails: bool = False,
                 workdir: str = "") -> dict:
        """Run ``name`` once (in the folder of ``workdir`` or of ``name``; ``processes=0``: one plain process).

        ``killed``: a process dies on purpose (torchrun then stops the others and fails); ``fails``: the run is
        expected to fail. Either way the result is just the log.
        """
        if name not in self.results:
            out = self.root / f"{name}.json"
            launch = [sys.executable]
            if processes:
                launch += ["-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
            folder = str(self.workdir(workdir or name))
            proc = subprocess.run(launch + [self.script, "--out", str(out), "--workdir", folder, *flags],
                                  env=env, capture_output=True, text=True, timeout=hang_timeout(300))
            log = proc.stdout + proc.stderr
            if killed:
                assert proc.returncode != 0 and "(SIGKILL)" in log, log[-4000:]
                self.results[name] = {"log": log}
            elif fails:
                assert proc.returncode != 0, log[-4000:]
                self.results[name] = {"log": log}
            else:
                assert proc.returncode == 0, log[-7000:]
                self.results[name] = {**json.loads(out.read_text()), "log": log}
        return self.results[name]
