"""trainwell underneath the libraries that subclass the reference's Trainer, run as their users run them.

* TRL's packaged command-line scripts (``trl.scripts.sft``, ``trl.scripts.dpo``, ``trl.scripts.reward``) with
  ``--use_peft``, their own argument parser, a tiny local model and a local dataset: ``python -m trl.scripts.X`` on
  the reference next to ``python -m trainwell.patch -m trl.scripts.X`` (docs/libraries.md), and a mid-run
  ``--resume_from_checkpoint``.
* TRL's trainers, sentence-transformers' trainer (three epochs: a new sample order each, resumed in the second) and
  the Trainer on a PEFT model (``load_best_model_at_end``, the best checkpoint not the last), from
  tests/libraries/library_script.py, which calls ``trainwell.patch_transformers()`` before the library is imported.

Each run is a process of its own; the reference's and trainwell's run side by side. Compared exactly: every logged
value but timings, the order of the batches trained on, and the final weights. Versions verified: see
docs/libraries.md (pyproject's test extra pins them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.common.timing import hang_timeout

SCRIPT = os.path.join(os.path.dirname(__file__), "libraries", "library_script.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(home: Path) -> dict[str, str]:
    # this checkout's trainwell in the child processes too; a cache of their own (they run side by side)
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(home)}


def _parallel(tmp: Path, commands: dict[str, list[str]]) -> None:
    """Run the commands side by side (one core each), each logging to tmp/NAME.log; fail with a failed one's log."""
    running = {}
    for name, command in commands.items():
        log = open(tmp / f"{name}.log", "w")
        running[name] = (subprocess.Popen(command, env=_env(tmp / f"{name}-hf"), stdout=log, stderr=subprocess.STDOUT,
                                          cwd=ROOT), log)
    for name, (proc, log) in running.items():
        try:
            code = proc.wait(timeout=hang_timeout(600))
        finally:
            log.close()
        assert code == 0, f"{name} failed:\n" + (tmp / f"{name}.log").read_text()[-6000:]


# --- library trainers from tests/libraries/library_script.py ---------------------------------------------------------


def _script(tmp: Path, library: str, backend: str, name: str, *flags: str) -> list[str]:
    return [sys.executable, SCRIPT, "--library", library, "--backend", backend, "--workdir", str(tmp / name),
            "--out", str(tmp / f"{name}.json"), *flags]


def _result(tmp: Path, name: str) -> dict:
    return json.loads((tmp / f"{name}.json").read_text())


def _compare(tmp: Path, library: str) -> tuple[dict, dict]:
    _parallel(tmp, {"reference": _script(tmp, library, "transformers", "reference"),
                    "trainwell": _script(tmp, library, "trainwell", "trainwell")})
    reference, ours = _result(tmp, "reference"), _result(tmp, "trainwell")
    assert "trainwell.trainer.Trainer" in ours["bases"] and "transformers.trainer.Trainer" not in ours["bases"]
    assert "trainwell.training_args.TrainingArguments" in ours["args_bases"]
    assert "transformers.trainer.Trainer" in reference["bases"]
    for key in ("losses", "eval_losses", "margins", "order", "weights", "global_step", "best", "adapter"):
        assert ours[key] == reference[key], key
    return reference, ours


def _resumes(tmp: Path, library: str, ours: dict, checkpoint: str = "checkpoint-3") -> dict:
    _parallel(tmp, {"resumed": _script(tmp, library, "trainwell", "resumed", "--resume",
                                       str(tmp / "trainwell" / checkpoint))})
    resumed = _result(tmp, "resumed")
    done = int(checkpoint.split("-")[1])
    assert resumed["global_step"] == ours["global_step"] and resumed["losses"] == ours["losses"]
    assert resumed["order"] == ours["order"][done:] and resumed["weights"] == ours["weights"]
    return resumed


def test_trl_sft_trainer_runs_on_trainwell_like_on_the_reference(tmp_path):
    pytest.importorskip("trl")
    _, ours = _compare(tmp_path, "sft")
    assert len(ours["losses"]) == 6 and len(ours["eval_losses"]) == 2
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(ours["checkpoint"])
    _resumes(tmp_path, "sft", ours)


# slow (TRAINWELL_SLOW=1): TRL's scripts below run the same trainer with LoRA, resumed, on both sides, and
# test_a_peft_model_reloads_the_same_best_adapter_... the best adapter's reload
@pytest.mark.slow
def test_trl_sft_trainer_with_a_peft_config_trains_resumes_and_reloads_the_best_adapter_like_the_reference(tmp_path):
    """SFTTrainer(peft_config=LoraConfig(...)) wraps the model in a PeftModel itself: adapter-only checkpoints, a
    resume from one, and load_best_model_at_end reloading the first evaluation's adapter, as on the reference."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    reference, ours = _compare(tmp_path, "sft-peft")
    ours_only = {"training_args.json", "checkpoint_manifest.json"}
    assert set(ours["checkpoint"]) - ours_only == set(reference["checkpoint"]) - {"training_args.bin"}
    assert "adapter_model.safetensors" in ours["checkpoint"] and ours["best"] == "checkpoint-3"
    resumed = _resumes(tmp_path, "sft-peft", ours)
    assert resumed["best"] == "checkpoint-3" and resumed["adapter"] == ours["adapter"]


# slow (TRAINWELL_SLOW=1): TRL's dpo script below runs DPOTrainer with LoRA, resumed, on both sides
@pytest.mark.slow
def test_trl_dpo_trainer_runs_on_trainwell_like_on_the_reference(tmp_path):
    pytest.importorskip("trl")
    _, ours = _compare(tmp_path, "dpo")
    assert len(ours["margins"]) == 6
    _resumes(tmp_path, "dpo", ours)


def test_sentence_transformers_trains_three_epochs_in_the_references_order_and_resumes_it(tmp_path):
    """sentence-transformers' trainer returns its own prepared loader: each epoch reshuffles by seed + epoch as on
    the reference, and a resume in the second epoch continues that order (dropout on: the RNG continues too).

    Its SoftmaxLoss trains a classifier that sentence-transformers does not checkpoint, so a resumed run, on either
    backend, continues with a fresh classifier: trainwell's resumed run is compared with the reference's."""
    pytest.importorskip("sentence_transformers")
    _, ours = _compare(tmp_path, "sentence-transformers")
    epochs = [ours["order"][i:i + 3] for i in (0, 3, 6)]
    assert len(ours["order"]) == 9 and len({tuple(e) for e in epochs}) == 3  # a new order in each epoch
    checkpoint = "checkpoint-4"  # one step into the second epoch
    _parallel(tmp_path, {f"{name}-resumed": _script(tmp_path, "sentence-transformers", backend, f"{name}-resumed",
                                                    "--resume", str(tmp_path / name / checkpoint))
                         for name, backend in (("reference", "transformers"), ("trainwell", "trainwell"))})
    resumed, reference = _result(tmp_path, "trainwell-resumed"), _result(tmp_path, "reference-resumed")
    assert resumed["order"] == ours["order"][4:]
    for key in ("order", "losses", "eval_losses", "weights", "global_step"):
        assert resumed[key] == reference[key], key


def test_a_peft_model_reloads_the_same_best_adapter_as_the_reference_when_the_best_is_not_the_last(tmp_path):
    pytest.importorskip("peft")
    reference, ours = _compare(tmp_path, "peft")
    assert ours["best"] == "checkpoint-4" and ours["global_step"] == 6  # the second of three evaluations
    assert ours["adapter"] and ours["adapter"] == reference["adapter"]


# --- TRL's command-line scripts, as their users run them ----------------------------------------------------------

# script -> (model, dataset, its own flags)
TRL_SCRIPTS = {"sft": ("lm", "text", []), "dpo": ("lm", "prefs", []),
               "reward": ("rm", "pairs", ["--lora_task_type", "SEQ_CLS"])}
# two micro-batches of 2 per step: the scripts' losses go through gradient accumulation (num_items_in_batch, and
# loss_is_scaled_for_ga=False for DPO and reward)
TRL_FLAGS = ["--max_steps", "6", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
             "--per_device_eval_batch_size", "4",
             "--logging_steps", "1", "--save_steps", "3", "--eval_strategy", "steps", "--eval_steps", "3",
             "--learning_rate", "1e-3", "--report_to", "none", "--seed", "0", "--use_cpu", "--disable_tqdm", "true",
             # TRL's configs default to bf16 (slow on a CPU) and gradient checkpointing
             "--bf16", "false", "--gradient_checkpointing", "false",
             "--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]


@pytest.fixture(scope="module")
def trl_inputs(tmp_path_factory) -> dict[str, str]:
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from tests.libraries import cli_inputs

    return cli_inputs.build(tmp_path_factory.mktemp("trl-inputs"))


@pytest.fixture(scope="module", params=sorted(TRL_SCRIPTS))
def trl_script(request, trl_inputs, tmp_path_factory) -> dict:
    """The script run on the reference and on trainwell, then trainwell resumed from its checkpoint-3 (copied into a
    folder of its own); for ``sft`` the reference resumed too (each run imports the reference's Trainer, seconds of
    CPU: the other scripts' resumes are held to trainwell's uninterrupted run, itself equal to the reference's)."""
    script = request.param
    model, data, flags = TRL_SCRIPTS[script]
    tmp = tmp_path_factory.mktemp(f"trl-{script}")

    def command(runner: list[str], name: str, *extra: str) -> list[str]:
        return [sys.executable, *runner, f"trl.scripts.{script}", "--model_name_or_path", trl_inputs[model],
                "--dataset_name", trl_inputs[data], "--output_dir", str(tmp / name), *TRL_FLAGS, *flags, *extra]

    _parallel(tmp, {"reference": command(["-m"], "reference"),
                    "trainwell": command(["-m", "trainwell.patch", "-m"], "trainwell")})
    runners = {"trainwell": ["-m", "trainwell.patch", "-m"], **({"reference": ["-m"]} if script == "sft" else {})}
    for name in runners:
        shutil.copytree(tmp / name / "checkpoint-3", tmp / f"{name}-resumed" / "checkpoint-3")
    _parallel(tmp, {f"{name}-resumed": command(runner, f"{name}-resumed", "--resume_from_checkpoint",
                                               str(tmp / f"{name}-resumed" / "checkpoint-3"))
                    for name, runner in runners.items()})
    return {"script": script, "tmp": tmp}


def _history(folder: Path) -> list[dict]:
    """The run's logged values but timings, from its last checkpoint."""
    state = json.loads((folder / "checkpoint-6" / "trainer_state.json").read_text())
    return [{k: v for k, v in entry.items() if "runtime" not in k and "per_second" not in k}
            for entry in state["log_history"]]


def _adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def _same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and bool((a[k] == b[k]).all()) for k in a)


def test_trl_script_with_use_peft_runs_on_trainwell_like_on_the_reference(trl_script):
    tmp = trl_script["tmp"]
    ours, reference = tmp / "trainwell", tmp / "reference"
    assert {"training_args.json", "checkpoint_manifest.json"} <= set(os.listdir(ours / "checkpoint-3"))  # trainwell's
    assert "training_args.bin" in os.listdir(reference / "checkpoint-3")
    history = _history(ours)
    assert sum("loss" in e for e in history) == 6 and sum("eval_loss" in e for e in history) == 2
    assert history == _history(reference)
    assert _same_tensors(_adapter(ours), _adapter(reference))  # the final adapter the script saved


def test_trl_script_resumed_mid_run_ends_as_the_uninterrupted_run_and_as_the_reference_resumed(trl_script):
    tmp = trl_script["tmp"]
    resumed = _history(tmp / "trainwell-resumed")
    if trl_script["script"] == "sft":
        assert resumed == _history(tmp / "reference-resumed")
    assert _same_tensors(_adapter(tmp / "trainwell-resumed"), _adapter(tmp / "trainwell"))

    def untimed(history: list[dict]) -> list[dict]:  # TRL's own token counter restarts at 0 on a resume (both)
        return [{k: v for k, v in entry.items() if not k.endswith("num_tokens")} for entry in history]

    assert untimed(resumed) == untimed(_history(tmp / "trainwell"))


SWITCH = """
import sys
import transformers
import trainwell
from trainwell.integrations import underneath
trainwell.patch_transformers()
trainwell.patch_transformers()  # idempotent
import transformers.trainer, transformers.trainer_callback
assert transformers.Trainer is trainwell.Trainer and transformers.trainer.Trainer is trainwell.Trainer
assert transformers.TrainingArguments is trainwell.TrainingArguments
assert transformers.trainer_callback.TrainerCallback is trainwell.TrainerCallback
assert transformers.Seq2SeqTrainer is trainwell.Seq2SeqTrainer
assert transformers.AutoModel.__module__.startswith("transformers.")  # the rest stays
underneath.unpatch_transformers()
assert transformers.Trainer.__module__ == "transformers.trainer" and not underneath.is_patched()
print("ok")
"""

TOO_LATE = """
import transformers
class Mine(transformers.Trainer):
    pass
import trainwell
try:
    trainwell.patch_transformers()
except RuntimeError as err:
    print(err)
"""


def test_the_switch_replaces_only_the_trainer_api_and_can_be_undone():
    proc = subprocess.run([sys.executable, "-c", SWITCH], capture_output=True, text=True, timeout=hang_timeout(120),
                          cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_the_switch_called_after_a_library_subclassed_the_reference_is_an_error():
    proc = subprocess.run([sys.executable, "-c", TOO_LATE], capture_output=True, text=True, timeout=hang_timeout(120),
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "patch_transformers() was called after __main__.Mine subclassed transformers' Trainer API" in proc.stdout
    assert "Call it first, before importing trl" in proc.stdout


RUNS_ON_TRAINWELL = """
import sys
import transformers
import trainwell
assert transformers.Trainer is trainwell.Trainer and transformers.TrainingArguments is trainwell.TrainingArguments
print("argv", sys.argv[1:], __name__, sys.argv[0].endswith("{suffix}"))
"""


def test_the_patch_runner_runs_a_module_or_a_script_as_main_on_trainwell(tmp_path):
    """``python -m trainwell.patch -m MODULE ARGS`` and ``... SCRIPT.py ARGS``: the script sees trainwell under the
    reference's names, its own arguments, and runs as ``__main__``; a missing one is a clear error (status 2)."""
    pytest.importorskip("transformers")
    (tmp_path / "mytool").mkdir()
    (tmp_path / "mytool" / "__init__.py").write_text("")
    (tmp_path / "mytool" / "cli.py").write_text(RUNS_ON_TRAINWELL.format(suffix="cli.py"))
    (tmp_path / "script.py").write_text(RUNS_ON_TRAINWELL.format(suffix="script.py"))
    env = {**_env(tmp_path / "hf"), "PYTHONPATH": os.pathsep.join((str(tmp_path), _env(tmp_path)["PYTHONPATH"]))}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trainwell.patch", *argv], env=env, capture_output=True,
                              text=True, timeout=hang_timeout(120), cwd=tmp_path)

    from trainwell.patch import _target

    assert _target(["-mmytool.cli", "a"]) == _target(["-m", "mytool.cli", "a"]) == ("mytool.cli", ["a"], True)
    for argv in (["-m", "mytool.cli"], [str(tmp_path / "script.py")]):
        done = run(*argv, "--output_dir", "x", "--flag")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "argv ['--output_dir', 'x', '--flag'] __main__ True" in done.stdout
    missing = run("-m", "nosuchtool.cli")
    assert missing.returncode == 2 and "no module named 'nosuchtool.cli'" in missing.stderr
    assert run("nosuch.py").returncode == 2 and run().returncode == 2
    assert "usage: python -m trainwell.patch -m MODULE" in run("--help").stdout


def test_a_module_whose_package_is_missing_is_refused_before_the_patch_imports_the_reference(monkeypatch, capsys):
    """The patch imports the reference's Trainer (seconds): a typo in the package name is said at once."""
    from trainwell import patch
    from trainwell.integrations import underneath

    monkeypatch.setattr(underneath, "patch_transformers", lambda: pytest.fail("patched for a missing package"))
    assert patch.main(["-m", "nosuchtool.cli", "--flag"]) == 2
    assert "no module named 'nosuchtool.cli'" in capsys.readouterr().err
