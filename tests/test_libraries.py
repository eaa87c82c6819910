"""trainwell underneath the libraries that subclass the reference's Trainer: ``trainwell.patch_transformers()``.

Each library's trainer runs twice from tests/libraries/library_script.py, on the reference and on trainwell, at the
same seed, in processes of their own: the same logged and evaluation losses, checkpoints, and a resume that gives
the uninterrupted run's losses. Versions verified: trl 1.16, sentence-transformers 6.2 (see pyproject's test extra).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "libraries", "library_script.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tmp: Path, library: str, backend: str, name: str, *flags: str) -> dict:
    out = tmp / f"{name}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    proc = subprocess.run([sys.executable, SCRIPT, "--library", library, "--backend", backend, "--workdir",
                           str(tmp / name), "--out", str(out), *flags],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return json.loads(out.read_text())


def _compare(tmp: Path, library: str, model_file: str = "model.safetensors") -> tuple[dict, dict]:
    reference = _run(tmp, library, "transformers", "reference")
    ours = _run(tmp, library, "trainwell", "trainwell")
    assert "trainwell.trainer.Trainer" in ours["bases"] and "transformers.trainer.Trainer" not in ours["bases"]
    assert "trainwell.training_args.TrainingArguments" in ours["args_bases"]
    assert "transformers.trainer.Trainer" in reference["bases"]
    assert ours["losses"] == pytest.approx(reference["losses"], rel=1e-6)
    assert ours["eval_losses"] == pytest.approx(reference["eval_losses"], rel=1e-6)
    assert len(ours["losses"]) == 6 and len(ours["eval_losses"]) == 2
    assert {model_file, "optimizer.pt", "trainer_state.json"} <= set(ours["checkpoint"])
    return reference, ours


def _resumes(tmp: Path, library: str, ours: dict) -> None:
    resumed = _run(tmp, library, "trainwell", "resumed", "--resume", str(tmp / "trainwell" / "checkpoint-3"))
    assert resumed["global_step"] == 6
    assert {k: v for k, v in resumed["losses"].items() if int(k) > 3} == {
        k: v for k, v in ours["losses"].items() if int(k) > 3}


def test_trl_sft_trainer_runs_on_trainwell_like_on_the_reference(tmp_path):
    pytest.importorskip("trl")
    _, ours = _compare(tmp_path, "sft")
    _resumes(tmp_path, "sft", ours)


def test_trl_sft_trainer_with_a_peft_config_trains_resumes_and_reloads_the_best_adapter_like_the_reference(tmp_path):
    """SFTTrainer(peft_config=LoraConfig(...)) wraps the model in a PeftModel itself: adapter-only checkpoints, a
    resume from one, and load_best_model_at_end reloading the first evaluation's adapter, as on the reference."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    reference, ours = _compare(tmp_path, "sft-peft", model_file="adapter_model.safetensors")
    ours_only = {"training_args.json", "checkpoint_manifest.json"}
    assert set(ours["checkpoint"]) - ours_only == set(reference["checkpoint"]) - {"training_args.bin"}
    assert ours["best"] == reference["best"] == "checkpoint-3"
    assert ours["adapter"] and ours["adapter"] == pytest.approx(reference["adapter"], rel=1e-6)
    _resumes(tmp_path, "sft-peft", ours)
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["best"] == "checkpoint-3" and resumed["adapter"] == ours["adapter"]


def test_trl_dpo_trainer_runs_on_trainwell_like_on_the_reference(tmp_path):
    pytest.importorskip("trl")
    reference, ours = _compare(tmp_path, "dpo")
    assert ours["margins"] == pytest.approx(reference["margins"], rel=1e-6, abs=1e-9)
    _resumes(tmp_path, "dpo", ours)


def test_sentence_transformers_trainer_runs_on_trainwell_like_on_the_reference(tmp_path):
    pytest.importorskip("sentence_transformers")
    _, ours = _compare(tmp_path, "sentence-transformers")
    _resumes(tmp_path, "sentence-transformers", ours)


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
    proc = subprocess.run([sys.executable, "-c", SWITCH], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_the_switch_called_after_a_library_subclassed_the_reference_is_an_error():
    proc = subprocess.run([sys.executable, "-c", TOO_LATE], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "patch_transformers() was called after __main__.Mine subclassed transformers' Trainer API" in proc.stdout
    assert "Call it first, before importing trl" in proc.stdout
