"""PEFT adapters end to end, with the real ``peft`` package on tiny ``transformers`` models built from a config.

A ``PeftModel`` (LoRA, IA3, prompt tuning, a sequence classifier whose head PEFT trains too (``modules_to_save``),
an adapter named other than ``"default"``, two adapters of which the second is active and trained) trains with the
reference's columns and label names, saves adapter-only checkpoints in the reference's layout, resumes bit for bit
(adapter weights, optimizer, scheduler, RNG, data position: compared with the uninterrupted run), reloads the best
adapter at the end, and ``save_model()`` / ``push_to_hub()`` write what ``PeftModel.from_pretrained`` loads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.common.hostile import as_reference
from tests.conftest import make_args

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from safetensors.torch import load_file  # noqa: E402

VOCAB = 48


def llama(seed: int = 0, classifier: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=64,
                                      pad_token_id=0, num_labels=3)
    cls = transformers.LlamaForSequenceClassification if classifier else transformers.LlamaForCausalLM
    return cls(config)


def samples(n: int = 32, classifier: bool = False, seed: int = 0) -> list[dict]:
    """Token rows (no padding) with a column the model does not take, which remove_unused_columns drops."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        ids = torch.randint(1, VOCAB, (8,), generator=g)
        label = torch.tensor(i % 3) if classifier else ids.clone()
        rows.append({"input_ids": ids, "labels": label, "source": i})
    return rows


def lora(**kwargs):
    return peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1, **kwargs)


def build(kind: str) -> torch.nn.Module:
    """A fresh PEFT model of ``kind`` (always the same initial weights for a kind)."""
    if kind == "classifier":  # PEFT trains the new head too: modules_to_save=["score"] (+ "classifier")
        base = llama(classifier=True)
        torch.manual_seed(1)
        return peft.get_peft_model(base, lora(task_type="SEQ_CLS"))
    base = llama()
    torch.manual_seed(1)
    if kind == "lora":
        return peft.get_peft_model(base, lora())
    if kind == "ia3":
        return peft.get_peft_model(base, peft.IA3Config(target_modules=["k_proj", "down_proj"],
                                                        feedforward_modules=["down_proj"]))
    if kind == "prompt":
        return peft.get_peft_model(base, peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    if kind == "named":
        return peft.get_peft_model(base, lora(), adapter_name="mine")
    if kind == "two":  # "default" stays frozen; "second" (in a subfolder of each checkpoint) is active and trained
        model = peft.get_peft_model(base, lora())
        model.add_adapter("second", peft.LoraConfig(r=2, target_modules=["k_proj", "o_proj"], lora_dropout=0.1))
        model.set_adapter("second")
        return model
    raise ValueError(kind)


KINDS = ["lora", "ia3", "prompt", "classifier", "named", "two"]


def first_is_best():
    """compute_metrics whose "order" is highest at the first evaluation: that checkpoint is the best."""
    calls = []

    def compute(prediction):
        calls.append(1)
        return {"order": -len(calls)}
    return compute


def train(out: str | Path, kind: str = "lora", resume=None, backend: str = "trainwell", metrics=None, **kwargs):
    if backend == "trainwell":
        from trainwell import Trainer
        args = make_args(str(out), **_settings(kwargs))
    else:
        Trainer = transformers.Trainer
        args = transformers.TrainingArguments(str(out), report_to="none", disable_tqdm=True, use_cpu=True,
                                              **_settings(kwargs))
    data = samples(classifier=kind == "classifier")
    trainer = Trainer(model=build(kind), args=args, train_dataset=data, eval_dataset=data[:8], compute_metrics=metrics)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _settings(kwargs: dict) -> dict:
    settings = dict(max_steps=6, per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=5e-2,
                    logging_steps=1, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2,
                    seed=3)
    return {**settings, **kwargs}


def adapter_weights(model) -> dict[str, torch.Tensor]:
    """Every adapter's saved-form tensors, by adapter: what its files hold."""
    return {f"{name}/{key}": value.detach().clone() for name in model.peft_config
            for key, value in peft.get_peft_model_state_dict(model, adapter_name=name).items()}


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor in a checkpoint: adapter files (subfolders too), optimizer, scheduler and RNG states."""
    out = {}
    for file in sorted(folder.rglob("*")):
        rel = file.relative_to(folder).as_posix()
        if file.suffix == ".safetensors":
            out.update({f"{rel}:{k}": v for k, v in load_file(str(file)).items()})
        elif file.suffix in (".pt", ".pth"):
            _flatten(torch.load(file, weights_only=True), rel, out)
    return out


def _flatten(obj, prefix: str, out: dict) -> None:
    if isinstance(obj, dict):
        for key, value in obj.items():
            _flatten(value, f"{prefix}.{key}", out)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _flatten(value, f"{prefix}.{i}", out)
    elif isinstance(obj, torch.Tensor):
        out[prefix] = obj
    else:
        out[prefix] = torch.tensor(obj) if isinstance(obj, (int, float, bool)) else obj


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def losses(trainer) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


# ------------------------------------------------------------------------------------------------ columns, labels
def test_a_peft_model_is_read_through_its_base_model_as_the_reference_reads_it(tmp_path):
    """remove_unused_columns=True keeps the base forward's columns, the label names come from it, and evaluation
    reports eval_loss: the same losses and metrics as the reference, on the same seed."""
    ours = train(tmp_path / "tw", metric_for_best_model="loss", load_best_model_at_end=True)
    reference = train(tmp_path / "ref", backend="transformers", metric_for_best_model="loss",
                      load_best_model_at_end=True)
    assert ours.label_names == reference.label_names == ["labels"]
    assert "input_ids" in ours._signature_columns and "source" not in ours._signature_columns
    assert losses(ours) == pytest.approx(losses(reference), rel=1e-6)
    evals = [h["eval_loss"] for h in ours.state.log_history if "eval_loss" in h]
    assert evals == pytest.approx([h["eval_loss"] for h in reference.state.log_history if "eval_loss" in h],
                                  rel=1e-6)
    assert len(evals) == 3 and ours.state.best_metric == pytest.approx(reference.state.best_metric, rel=1e-6)
    # the reference's checkpoint layout: the adapter only, next to the training state
    files = {p.name for p in (tmp_path / "tw" / "checkpoint-2").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "scheduler.pt",
            "rng_state.pth", "trainer_state.json"} <= files
    assert not files & {"model.safetensors", "pytorch_model.bin"}
    for step in (2, 4, 6):
        ours_file = tmp_path / "tw" / f"checkpoint-{step}" / "adapter_model.safetensors"
        assert ours_file.read_bytes() == (tmp_path / "ref" / f"checkpoint-{step}" / ours_file.name).read_bytes()
    assert_same(adapter_weights(ours.model), adapter_weights(reference.model))  # the same best adapter reloaded


# ------------------------------------------------------------------------------------------------ resume
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each kind's uninterrupted run, trained once for the module."""
    runs = {}

    def get(kind: str):
        if kind not in runs:
            out = tmp_path_factory.mktemp(f"full-{kind}")
            runs[kind] = (out, train(out, kind))
        return runs[kind]
    return get


@pytest.mark.parametrize("kind", KINDS)
def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path, uninterrupted, kind):
    full_dir, full = uninterrupted(kind)
    shutil.copytree(full_dir / "checkpoint-2", tmp_path / "checkpoint-2")
    resumed = train(tmp_path, kind, resume=True)
    assert losses(resumed) == losses(full)  # data position and RNG (LoRA dropout) restored: the same batches
    assert_same(adapter_weights(resumed.model), adapter_weights(full.model))
    final, full_final = tmp_path / "checkpoint-6", full_dir / "checkpoint-6"
    assert_same(tensors_of(final), tensors_of(full_final))  # adapters, optimizer, scheduler, RNG: bit for bit
    if kind == "two":  # the inactive adapter stays frozen, saved at the root; the trained one in its subfolder
        assert (final / "adapter_model.safetensors").is_file() and (final / "second" / "adapter_config.json").is_file()
        assert not any(p.requires_grad for n, p in resumed.model.named_parameters() if ".default." in n)
        fresh = build("two")
        assert_same({k: v for k, v in adapter_weights(resumed.model).items() if k.startswith("default/")},
                    {k: v for k, v in adapter_weights(fresh).items() if k.startswith("default/")})
    if kind == "named":
        assert (final / "mine" / "adapter_model.safetensors").is_file()
        assert not (final / "adapter_model.safetensors").exists()
    if kind == "classifier":  # the head PEFT trains besides the adapter is saved, trained and restored
        keys = load_file(str(final / "adapter_model.safetensors"))
        assert any(".score." in key for key in keys)
        assert not torch.equal(build(kind).base_model.model.score.modules_to_save["default"].weight,
                               resumed.model.base_model.model.score.modules_to_save["default"].weight)


def test_resuming_from_a_path_restores_the_adapter_before_the_optimizer_is_built(tmp_path, uninterrupted):
    full_dir, full = uninterrupted("lora")
    resumed = train(tmp_path, "lora", resume=str(full_dir / "checkpoint-4"))
    assert losses(resumed) == losses(full)
    # the optimizer holds the adapter's own parameters (loaded in place), and only trainable ones
    held = {id(p) for group in resumed.optimizer.param_groups for p in group["params"]}
    trainable = {id(p) for p in resumed.model.parameters() if p.requires_grad}
    assert held == trainable and trainable


def test_an_adapter_saved_as_bin_resumes(tmp_path, uninterrupted):
    """adapter_model.bin (safe_serialization=False) loads too, weights-only."""
    full_dir, full = uninterrupted("lora")
    checkpoint = tmp_path / "checkpoint-2"
    shutil.copytree(full_dir / "checkpoint-2", checkpoint)
    weights = load_file(str(checkpoint / "adapter_model.safetensors"))
    torch.save(weights, checkpoint / "adapter_model.bin")
    (checkpoint / "adapter_model.safetensors").unlink()
    as_reference(checkpoint)  # as the reference writes it: no manifest
    assert losses(train(tmp_path, "lora", resume=True)) == losses(full)


def test_an_adapter_of_another_shape_is_refused_with_its_name(tmp_path, uninterrupted):
    from trainwell import Trainer

    full_dir, _ = uninterrupted("lora")
    model = peft.get_peft_model(llama(), peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    trainer = Trainer(model=model, args=make_args(str(tmp_path), **_settings({"eval_strategy": "no"})),
                      train_dataset=samples())
    with pytest.raises(RuntimeError, match=r"The adapter 'default' saved in .*checkpoint-2 does not fit the model"):
        trainer.train(resume_from_checkpoint=str(full_dir / "checkpoint-2"))


def test_an_adapter_with_other_target_modules_is_refused_naming_the_missing_keys(tmp_path, uninterrupted):
    from trainwell import Trainer

    full_dir, _ = uninterrupted("lora")
    model = peft.get_peft_model(llama(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "k_proj"]))
    trainer = Trainer(model=model, args=make_args(str(tmp_path), **_settings({"eval_strategy": "no"})),
                      train_dataset=samples())
    with pytest.raises(RuntimeError, match=r"missing \[.*k_proj\.lora_A\.weight"):
        trainer.train(resume_from_checkpoint=str(full_dir / "checkpoint-2"))


def test_a_checkpoint_without_the_active_adapter_names_what_it_holds(tmp_path, uninterrupted):
    from trainwell import Trainer

    full_dir, _ = uninterrupted("named")
    model = build("lora")  # active adapter "default"; the checkpoint holds "mine"
    trainer = Trainer(model=model, args=make_args(str(tmp_path), **_settings({"eval_strategy": "no"})),
                      train_dataset=samples())
    with pytest.raises(FileNotFoundError, match=r"No weights of the active adapter 'default' .* holds 'mine'"):
        trainer.train(resume_from_checkpoint=str(full_dir / "checkpoint-2"))


def test_an_adapter_only_in_the_checkpoint_is_added_like_the_reference_does(tmp_path, uninterrupted, caplog):
    """The checkpoint holds "default" and "second"; a model with only "second" gets "default" back, frozen."""
    full_dir, full = uninterrupted("two")
    model = peft.get_peft_model(llama(), peft.LoraConfig(r=2, target_modules=["k_proj", "o_proj"],
                                                         lora_dropout=0.1), adapter_name="second")
    assert list(model.peft_config) == ["second"]
    from trainwell import Trainer

    trainer = Trainer(model=model, args=make_args(str(tmp_path), **_settings({})), train_dataset=samples(),
                      eval_dataset=samples()[:8])
    trainer.train(resume_from_checkpoint=str(full_dir / "checkpoint-4"))
    assert sorted(model.peft_config) == ["default", "second"] and "added (inactive, frozen)" in caplog.text
    assert_same(adapter_weights(model), adapter_weights(full.model))


# ------------------------------------------------------------------------------------------------ best model, saving
@pytest.mark.parametrize("kind", ["lora", "named", "two", "prompt"])
def test_the_best_adapter_is_reloaded_at_the_end(tmp_path, kind):
    trainer = train(tmp_path, kind, load_best_model_at_end=True, metric_for_best_model="order",
                    save_total_limit=1, metrics=first_is_best())
    best = Path(trainer.state.best_model_checkpoint)
    assert best.name == "checkpoint-2" and sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]
    saved = {}
    for name in trainer.model.peft_config:
        folder = best if name == "default" else best / name
        saved.update({f"{name}/{k}": v for k, v in load_file(str(folder / "adapter_model.safetensors")).items()})
    assert_same(adapter_weights(trainer.model), saved)
    assert not torch.equal(next(iter(saved.values())), next(iter(adapter_weights(build(kind)).values()))) or \
        kind == "two"  # trained since initialization (in "two", the first tensor is the frozen adapter's)


@pytest.mark.parametrize("kind", ["lora", "named", "two", "classifier"])
def test_save_model_writes_what_peft_from_pretrained_loads(tmp_path, kind):
    trainer = train(tmp_path / "run", kind, save_strategy="no", eval_strategy="no")
    out = tmp_path / "final"
    trainer.save_model(str(out))
    assert not (out / "model.safetensors").exists() and (out / "training_args.json").is_file()
    base = llama(seed=5, classifier=kind == "classifier")  # other base weights: only the adapter is loaded
    names = list(trainer.model.peft_config)
    first = names[0]
    folder = out if first == "default" else out / first
    loaded = peft.PeftModel.from_pretrained(base, str(folder), adapter_name=first)
    for name in names[1:]:
        loaded.load_adapter(str(out / name), adapter_name=name)
    assert_same(adapter_weights(loaded), adapter_weights(trainer.model))


def test_save_async_writes_the_same_adapter_and_copies_no_base_weights(tmp_path, uninterrupted):
    from trainwell.checkpoint.adapters import state_to_snapshot

    full_dir, _ = uninterrupted("classifier")
    asynchronous = train(tmp_path, "classifier", save_async=True)
    for step in (2, 4, 6):
        assert_same(tensors_of(tmp_path / f"checkpoint-{step}"), tensors_of(full_dir / f"checkpoint-{step}"))
    snapshot = state_to_snapshot(asynchronous.model)
    assert snapshot and all("lora_" in k or "modules_to_save" in k for k in snapshot)
    full = asynchronous.model.state_dict()
    assert sum(t.numel() for t in snapshot.values()) < sum(t.numel() for t in full.values()) / 10


def test_push_to_hub_uploads_the_adapter(tmp_path, monkeypatch):
    hub_constants = pytest.importorskip("huggingface_hub.constants")
    from tests.common.fake_hub import FakeHub

    with FakeHub() as hub:
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.url)
        trainer = train(tmp_path / "run", "named", push_to_hub=True, hub_model_id="adapters",
                        eval_strategy="no", hub_strategy="every_save", hub_always_push=True)
        trainer._finish_current_push()
        # each checkpoint's push carries the adapter, in its subfolder (the reference's leaves that out)
        steps = [c for c in hub.commits if c.message.startswith("Training in progress")]
        assert len(steps) == 3 and all("mine/adapter_model.safetensors" in c.files for c in steps)
        trainer.push_to_hub()
        files = hub.files("tester/adapters")
    assert "mine/adapter_model.safetensors" in files and "mine/adapter_config.json" in files
    assert "model.safetensors" not in files
    (tmp_path / "pulled" / "mine").mkdir(parents=True)
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (tmp_path / "pulled" / "mine" / name).write_bytes(files[f"mine/{name}"])
    loaded = peft.PeftModel.from_pretrained(llama(seed=5), str(tmp_path / "pulled" / "mine"), adapter_name="mine")
    assert_same(adapter_weights(loaded), adapter_weights(trainer.model))
