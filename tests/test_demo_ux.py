"""The demo as a person meets it (issue 14): Ctrl-C keeps the step in progress, a rerun of a finished run says so
at once and leaves its files alone, and ``scripts/demo.sh`` sets up only once."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from tests.common.cli import run_cli
from tests.common.timing import hang_timeout
from trainwell.cli import main, own_command
from trainwell.report import load_run, summary

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
    # the interrupted run has its report (from its checkpoint and its live log), and says where
    assert f"the run report so far: {out / 'report' / 'index.html'}" in text
    assert (out / "report" / "index.html").exists()

    code, text = _demo(capsys, out, "--steps", step + 2, "--no-report")
    assert code == 0 and f"resuming from {out / f'checkpoint-{step}'}" in text
    # this session trained 2 steps (the total is step + 2)
    assert f"training: 2 steps this session (steps {step}-{step + 2}, resumed at {step})" in text
    # the report marks the resume at the checkpoint's step, which falls between two logging steps (every 10)
    assert summary(load_run(out))["sessions"] == f"2 (resumed at step {step})"


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
                          timeout=hang_timeout(60))


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
    first = subprocess.run(["bash", script, "--steps", "3"], capture_output=True, text=True, timeout=hang_timeout(60))
    assert first.returncode == 0 and first.stdout == "setup-ran report\ndemo --steps 3\n", first
    again = subprocess.run(["bash", script, "--steps", "3"], capture_output=True, text=True, timeout=hang_timeout(60))
    assert again.returncode == 0 and again.stdout == "demo --steps 3\n", again
    with open(root / "pyproject.toml", "a") as fh:
        fh.write("version = '2'\n")
    changed = subprocess.run(["bash", script], capture_output=True, text=True, timeout=hang_timeout(60))
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


def test_setup_env_filters_setuptools_editable_notice_only(tmp_path):
    """setuptools prints a 12-line "Editable installation. Please be careful..." notice on every editable install,
    relayed by pip as a BuildBackendWarning (issue 34): the set-up filters that warning, and only that one."""
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "scripts", "setup_env.sh"), root / "scripts" / "setup_env.sh")
    bin_dir, venv_bin = tmp_path / "bin", root / ".venv" / "bin"
    bin_dir.mkdir()
    venv_bin.mkdir(parents=True)
    (bin_dir / "python3").write_text("#!/bin/sh\nexit 0\n")  # `python3 -m venv .venv`: the venv is already there
    emit = ("import warnings; warnings.warn('Editable installation.\\n!!\\n  Please be careful with folders', "
            "UserWarning); warnings.warn('a warning pip would show', UserWarning); "
            "print('Requirement already satisfied: numpy'); print('Collecting pyyaml')")
    (venv_bin / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" -c "{emit}"\n')
    for script in (bin_dir / "python3", venv_bin / "python"):
        script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run(["bash", str(root / "scripts" / "setup_env.sh"), "report"], capture_output=True,
                          text=True, timeout=hang_timeout(60), env=env)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "Editable installation" not in output and "Please be careful" not in output
    assert "a warning pip would show" in output
    # what it does and how long it takes, step by step, and pip's progress but its "already satisfied" lines
    assert re.search(r"Setting up \.venv/.* torch 2\.13\.0 and trainwell \[report\] .*about 1-2 minutes the first "
                     r"time", done.stdout), done.stdout
    steps = re.findall(r"^\[set-up (\d)/4\] (.*)$", done.stdout, re.M)
    assert [n for n, _ in steps] == ["1", "2", "3", "4"] and all(re.search(r"\(.*(s|seconds|minutes)", t)
                                                               for _, t in steps), steps
    assert "Collecting pyyaml" in output and "Requirement already satisfied" not in output
    assert re.search(r"^\[set-up done\] in \dm\d\ds$", done.stdout, re.M), done.stdout


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
    # the demo's model is used with one command (issue 34): predict rebuilds it from task.json, bytes in and out
    # ... printed as it runs when pasted: the path of the running program, or `PYTHON -m trainwell` in-process
    assert f"use the model    {own_command()} predict {out} 'def '" in text
    assert own_command().endswith(" -m trainwell")
    task = json.loads((out / "task.json").read_text())
    assert task["tokenizer"] == "bytes" and task["generation"] == {"temperature": 0.8, "top_k": 40}
    assert (out / "checkpoint-6" / "task.json").exists()  # in every checkpoint too
    code, predicted, err = run_cli(capsys, "predict", out, "def ", "class A", "--max-new-tokens", "8")
    lines = predicted.splitlines()
    assert code == 0 and err == "" and len(lines) == 2, (predicted, err)
    assert lines[0].startswith("def ") and len(lines[0]) > len("def ") and lines[1].startswith("class A")


def test_the_commands_printed_run_as_pasted_without_the_venv_activated(tmp_path, monkeypatch):
    # `trainwell report --watch ...` printed by the demo was "command not found" in a shell without the venv
    # activated: the command printed is the running program's path, relative inside the current folder.
    program = tmp_path / ".venv" / "bin" / "trainwell"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(program), "demo"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    assert own_command() == ".venv/bin/trainwell"
    monkeypatch.setenv("PATH", f"{program.parent}:/usr/bin:/bin")  # installed on the PATH: the name runs it
    assert own_command() == "trainwell"
    monkeypatch.setenv("VIRTUAL_ENV", str(program.parent.parent))  # activated here, maybe not in another shell
    assert own_command() == ".venv/bin/trainwell"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # outside the folder: the absolute path
    assert own_command() == str(program)
    monkeypatch.setattr(sys, "argv", [os.path.join(os.path.dirname(main.__code__.co_filename), "..", "__main__.py")])
    assert own_command().endswith(" -m trainwell")  # python -m trainwell

