"""The demo as a person meets it (issue 14): Ctrl-C keeps the step in progress, a rerun of a finished run says so
at once and leaves its files alone, and ``scripts/demo.sh`` sets up only once."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from trainwell.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_SH = os.path.join(ROOT, "scripts", "demo.sh")
TINY = ["--size", "tiny", "--evals", "1", "--sample-bytes", "4", "--device", "cpu"]


def _demo(capsys, out, *argv):
    code = main(["demo", *TINY, "--output-dir", str(out), *[str(a) for a in argv]])
    return code, capsys.readouterr().out


# --- Ctrl-C ----------------------------------------------------------------------------------------------------------


def _interrupt_after(out, at_least: int) -> tuple[int, str]:
    """Start a long demo in a fresh process, send SIGINT once its progress shows step >= ``at_least``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.Popen([sys.executable, "-m", "trainwell", "demo", *TINY, "--steps", "100000",
                             "--output-dir", str(out)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            step = re.match(r"\[(\d+)/100000 ", line)
            if step and int(step.group(1)) >= at_least:
                proc.send_signal(signal.SIGINT)
                break
        stdout, stderr = proc.communicate()
    finally:
        watchdog.cancel()
    return proc.returncode, "".join(seen) + stdout + "\n--- stderr ---\n" + stderr


def test_ctrl_c_saves_the_step_in_progress_and_the_rerun_resumes_there(tmp_path, capsys):
    out = tmp_path / "demo"
    code, text = _interrupt_after(out, at_least=20)  # --evals 1: the only scheduled save is at step 100000
    assert code == 130, text
    step = int(re.search(r"interrupted at step (\d+)\.", text).group(1))
    assert step >= 20 and (out / f"checkpoint-{step}").is_dir(), text
    assert f"resume from {out / f'checkpoint-{step}'}, saved just now" in text
    assert "Traceback" not in text

    code, text = _demo(capsys, out, "--steps", step + 2, "--no-report")
    assert code == 0 and f"resuming from {out / f'checkpoint-{step}'}" in text
    assert f"training: {step + 2} steps" in text


# --- rerun of a finished run ------------------------------------------------------------------------------------------


def _snapshot(folder) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_rerun_of_a_finished_demo_says_so_at_once_and_leaves_its_files(tmp_path, capsys):
    out = tmp_path / "demo"
    code, _ = _demo(capsys, out, "--steps", 4)
    assert code == 0 and (out / "report" / "index.html").exists()
    before = _snapshot(out)

    started = time.monotonic()
    code, text = _demo(capsys, out, "--steps", 4)
    assert code == 0 and time.monotonic() - started < 5
    assert f"{out} is already trained to step 4, as --steps asks: nothing to train" in text
    assert "run again with a larger --steps (e.g. --steps 8)" in text
    assert f"The run report: {out / 'report' / 'index.html'}" in text
    assert "byte-level transformer" not in text and "max_steps" not in text  # nothing was built
    assert _snapshot(out) == before

    code, text = _demo(capsys, out, "--steps", 2)
    assert code == 0 and "already trained to step 4, past the --steps 2 asked for" in text
    assert _snapshot(out) == before


def test_a_run_stopped_after_its_last_checkpoint_is_finished_by_the_rerun(tmp_path, capsys):
    out = tmp_path / "demo"
    assert _demo(capsys, out, "--steps", 2, "--no-report")[0] == 0
    os.remove(out / "trainer_state.json")  # as if stopped between the last checkpoint and the final save
    code, text = _demo(capsys, out, "--steps", 2, "--no-report")
    assert code == 0 and "already trained" not in text and "validation loss:" in text
    assert (out / "trainer_state.json").exists()


# --- scripts/demo.sh ------------------------------------------------------------------------------------------------


def _bash(script: str, *args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script, "bash", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def _fake_project(tmp_path):
    """A project folder with demo.sh and a fake setup_env.sh that 'installs' a trainwell that echoes."""
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(DEMO_SH, root / "scripts" / "demo.sh")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "scripts" / "setup_env.sh").write_text(
        "set -e\ncd \"$(dirname \"$0\")/..\"\necho setup-ran \"$1\"\nmkdir -p .venv/bin\n"
        "printf '#!/bin/sh\\necho \"$@\"\\n' > .venv/bin/trainwell\n"
        "printf '#!/bin/sh\\nexit 0\\n' > .venv/bin/python\nchmod +x .venv/bin/trainwell .venv/bin/python\n")
    return root


def test_demo_sh_sets_up_once_and_again_when_pyproject_changes(tmp_path):
    root = _fake_project(tmp_path)
    script = str(root / "scripts" / "demo.sh")
    first = subprocess.run(["bash", script, "--steps", "3"], capture_output=True, text=True, timeout=60)
    assert first.returncode == 0 and first.stdout == "setup-ran report\ndemo --steps 3\n", first
    again = subprocess.run(["bash", script, "--steps", "3"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == "demo --steps 3\n", again
    with open(root / "pyproject.toml", "a") as fh:
        fh.write("version = '2'\n")
    changed = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60)
    assert changed.stdout == "setup-ran report\ndemo\n", changed


def test_demo_sh_needs_set_up_unless_the_venv_imports_this_checkouts_trainwell(tmp_path):
    """``setup_needed`` with the real interpreter: a stamped venv of this checkout is up to date; the same
    venv for another folder (its trainwell is not that folder's) or without a stamp is not."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')  # this test's venv
    (venv / "bin" / "trainwell").write_text("#!/bin/sh\n")
    for name in ("python", "trainwell"):
        (venv / "bin" / name).chmod(0o755)
    needed = f'source "{DEMO_SH}"; if setup_needed "$1" "$2"; then echo needed; else echo skip; fi'
    assert _bash(needed, ROOT, str(venv)).stdout == "needed\n"  # no stamp yet
    stamp = _bash(f'source "{DEMO_SH}"; setup_fingerprint "$1" > "$2/.trainwell-demo-setup"', ROOT, str(venv))
    assert stamp.returncode == 0, stamp.stderr
    assert _bash(needed, ROOT, str(venv)).stdout == "skip\n"
    other = _fake_project(tmp_path)
    _bash(f'source "{DEMO_SH}"; setup_fingerprint "$1" > "$2/.trainwell-demo-setup"', str(other), str(venv))
    assert _bash(needed, str(other), str(venv)).stdout == "needed\n"  # trainwell imports from ROOT, not there


# --- the terminal ----------------------------------------------------------------------------------------------------


def test_a_demo_prints_one_short_line_per_log_and_a_finished_run_says_how_to_go_further(tmp_path, capsys):
    out = tmp_path / "demo"
    code, text = _demo(capsys, out, "--steps", 6, "--no-report")  # logging_steps 1: six training logs
    assert code == 0, text
    logs = [line for line in text.splitlines() if re.match(r"\[\d+/6 ", line)]
    train = [line for line in logs if re.search(r"\] loss \d", line)]
    evals = [line for line in logs if "] eval: loss " in line]
    assert len(train) == 6 and len(evals) == 2 and len(logs) == 9, text  # evaluations at 0 and 6, the summary
    assert all(len(line) < 110 and "'" not in line for line in logs), logs  # numbers as numbers, one line each
    assert re.search(r"lr [\d.e-]+  epoch [\d.e-]+  [\d.]+ tok/s$", train[-1]), train[-1]
    assert re.search(r"perplexity [\d.]+  \([\d.]+ s\)", evals[0]), evals[0]
    assert "run the same command again to resume" not in text
    assert "to train further: the same command with --steps 12" in text
