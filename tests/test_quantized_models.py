"""Quantized models: which can be trained (the reference's ``validate_quantization_for_training`` rules, checked on
models whose attributes mark them quantized as ``transformers`` marks them), and the QLoRA recipe for real:
bitsandbytes 4-bit NF4 + LoRA on a tiny Llama, on the CPU (bitsandbytes 0.50 runs there), against the reference.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import types

import pytest
import torch

from tests.common.models import RegressionDataset, RegressionModel
from tests.conftest import make_args

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from transformers.trainer_utils import validate_quantization_for_training as reference_check  # noqa: E402


def quantizer(method: str = "gptq", trainable: bool = True, qat: bool = False) -> types.SimpleNamespace:
    return types.SimpleNamespace(is_trainable=trainable, is_qat_trainable=qat,
                                 quantization_config=types.SimpleNamespace(quant_method=method))


def marked(model: torch.nn.Module, **attributes) -> torch.nn.Module:
    """``model`` with the attributes transformers sets on a quantized model (on a PEFT model: on its base)."""
    target = model.get_base_model() if isinstance(model, peft.PeftModel) else model
    attributes = {"is_quantized": True, "hf_quantizer": quantizer(), **attributes}
    for name, value in attributes.items():
        setattr(target, name, value)
    return model


def lora_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                      num_key_value_heads=4, vocab_size=32, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config)
    return peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))


def trainer(model, out_dir, **kwargs):
    from trainwell import Trainer

    return Trainer(model=model, args=make_args(out_dir, max_steps=2, **kwargs),
                   train_dataset=RegressionDataset(length=8))


def test_a_quantized_model_without_adapters_is_refused_like_the_reference_refuses_it(out_dir):
    model = marked(RegressionModel())
    with pytest.raises(ValueError, match="cannot perform fine-tuning on purely quantized models"):
        reference_check(model)
    with pytest.raises(ValueError, match=r"quantized \(gptq\) and has no trainable adapters.*get_peft_model"):
        trainer(model, out_dir)


def test_a_quantizer_that_trains_itself_or_adapters_attached_by_transformers_pass(out_dir):
    qat = marked(RegressionModel(), hf_quantizer=quantizer(qat=True))
    reference_check(qat)
    trainer(qat, out_dir).train()  # quantization-aware training: the model's own weights train
    attached = marked(RegressionModel(), _hf_peft_config_loaded=True)  # transformers' model.add_adapter
    reference_check(attached)
    trainer(attached, out_dir)
    trainer(RegressionModel(), out_dir)  # not quantized at all


def test_a_quantization_method_that_cannot_train_is_refused_with_its_name(out_dir):
    model = marked(lora_llama(), hf_quantizer=quantizer("hqq_frozen", trainable=False))
    with pytest.raises(ValueError, match="do not support training"):
        reference_check(model)
    with pytest.raises(ValueError, match="quantized with hqq_frozen, which does not support training"):
        trainer(model, out_dir)


def test_a_quantized_peft_model_is_not_fine_tuned_compiled(out_dir):
    model = marked(lora_llama())
    reference_check(model)  # adapters on a quantized base: trainable
    trainer(model, out_dir)
    compiled = torch.compile(model)
    with pytest.raises(ValueError, match="cannot fine-tune quantized model with `torch.compile"):
        reference_check(compiled)
    with pytest.raises(ValueError, match=r"the model was given compiled \(torch.compile\).*Pass the model uncompiled"):
        trainer(compiled, out_dir)
    # the reference compiles such a model later without a word; trainwell refuses the argument too (documented)
    with pytest.raises(ValueError, match=r"quantized \(gptq\) and torch_compile=True"):
        trainer(model, out_dir, torch_compile=True)


BNB = {"quantization_method": "bitsandbytes", "is_loaded_in_4bit": True,
       "hf_quantizer": quantizer("bitsandbytes")}


def test_a_bitsandbytes_model_on_a_device_bitsandbytes_does_not_support_names_what_is_missing(out_dir, monkeypatch):
    model = marked(lora_llama(), **BNB)
    fake = types.ModuleType("bitsandbytes")
    fake.__version__, fake.supported_torch_devices = "0.43.0", {"cuda"}
    monkeypatch.setitem(sys.modules, "bitsandbytes", fake)
    with pytest.raises(RuntimeError, match=r"bitsandbytes 0.43.0, which runs on cuda, and this run's device is cpu"
                                           r".*Train it on a CUDA GPU"):
        trainer(model, out_dir)
    del fake.supported_torch_devices  # releases before the multi-device backends: CUDA only
    with pytest.raises(RuntimeError, match="runs on cuda, and this run's device is cpu"):
        trainer(model, out_dir)
    fake.supported_torch_devices = {"cuda", "cpu"}
    trainer(model, out_dir)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # not installed
    with pytest.raises(ImportError, match="quantized with bitsandbytes, which is not installed here: pip install"):
        trainer(model, out_dir)


# ------------------------------------------------------------------------------------------------ QLoRA for real
def _bitsandbytes_on_cpu() -> bool:
    if importlib.util.find_spec("bitsandbytes") is None:
        return False
    import bitsandbytes

    return "cpu" in set(getattr(bitsandbytes, "supported_torch_devices", ()))


def qlora(folder) -> torch.nn.Module:
    """The QLoRA recipe: a 4-bit NF4 base, prepared for k-bit training, LoRA on its attention."""
    config = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                             bnb_4bit_compute_dtype=torch.float32)
    base = transformers.LlamaForCausalLM.from_pretrained(folder, quantization_config=config)
    base = peft.prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
    torch.manual_seed(1)
    return peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.1))


@pytest.mark.skipif(not _bitsandbytes_on_cpu(), reason="needs bitsandbytes with its CPU backend (0.50 has it)")
def test_qlora_trains_resumes_and_saves_like_the_reference(tmp_path):
    from trainwell import Trainer, TrainingArguments

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, vocab_size=64, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "base")
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": (ids := torch.randint(0, 64, (8,), generator=g)), "labels": ids.clone()} for _ in range(24)]
    settings = dict(max_steps=4, per_device_train_batch_size=4, learning_rate=1e-2, logging_steps=1, seed=3,
                    save_strategy="steps", save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True)

    def run(trainer_cls, args_cls, out, resume=None):
        model = qlora(tmp_path / "base")
        assert model.get_base_model().is_loaded_in_4bit
        run = trainer_cls(model=model, args=args_cls(output_dir=str(out), **settings), train_dataset=data)
        run.train(resume_from_checkpoint=resume)
        return {h["step"]: h["loss"] for h in run.state.log_history if "loss" in h}

    ours = run(Trainer, TrainingArguments, tmp_path / "tw")
    reference = run(transformers.Trainer, transformers.TrainingArguments, tmp_path / "ref")
    assert ours == pytest.approx(reference, rel=1e-6)
    checkpoint = tmp_path / "tw" / "checkpoint-4"
    assert (checkpoint / "adapter_model.safetensors").is_file() and not (checkpoint / "model.safetensors").exists()
    shutil.copytree(tmp_path / "tw" / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    assert run(Trainer, TrainingArguments, tmp_path / "resumed", resume=True) == ours
    resumed = (tmp_path / "resumed" / "checkpoint-4" / "adapter_model.safetensors").read_bytes()
    assert resumed == (checkpoint / "adapter_model.safetensors").read_bytes()
