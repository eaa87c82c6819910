"""NEFTune (trainwell.techniques.neftune): noise only in train mode, its bound and shape, clean removal, clear
errors, and (when transformers is installed) bitwise parity with the reference's hook at the same seed."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainwell.techniques.neftune import (
    ALPHA_ATTR,
    NeftuneHandle,
    activate_neftune,
    deactivate_neftune,
    find_input_embeddings,
    neftune,
    neftune_noise_bound,
)


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, hidden: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids))


class NoEmbeddings(nn.Module):
    def get_input_embeddings(self) -> None:
        return None


class Wrapper(nn.Module):
    """Stands in for DDP / FSDP: the real model sits under ``.module``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = model


class PeftModel(nn.Module):
    """Stands in for peft's PeftModel (recognised by class name): the model sits at ``base_model.model``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.base_model = nn.Module()
        self.base_model.model = model


def _hooks(module: nn.Module) -> int:
    return len(module._forward_hooks)


def _ids(batch: int = 2, seq: int = 5, vocab: int = 64) -> torch.Tensor:
    return torch.arange(batch * seq).reshape(batch, seq) % vocab


def test_noise_in_train_mode_only():
    model = TinyLM()
    ids = _ids()
    plain = model.embed(ids)
    with neftune(model, 5.0):
        model.train()
        noisy = model.embed(ids)
        model.eval()
        evaluated = model.embed(ids)
    assert not torch.equal(noisy, plain)
    assert torch.equal(evaluated, plain)


def test_noise_bound_and_distribution():
    hidden, seq, alpha = 64, 128, 5.0
    model = TinyLM(vocab=seq, hidden=hidden).train()
    ids = torch.arange(seq).repeat(64, 1)
    plain = model.embed(ids)
    with neftune(model, alpha):
        noise = (model.embed(ids) - plain).detach()
    bound = alpha / math.sqrt(seq * hidden)
    assert neftune_noise_bound(alpha, seq, hidden) == pytest.approx(bound, rel=1e-6)
    assert noise.abs().max().item() <= bound * (1 + 1e-5)
    assert noise.abs().max().item() > 0.99 * bound  # 500k draws: the extremes of U(-b, b) are reached
    assert abs(noise.mean().item()) < 0.01 * bound
    assert noise.var().item() == pytest.approx(bound**2 / 3, rel=0.02)  # variance of U(-b, b)
    assert (noise.abs() < bound / 2).float().mean().item() == pytest.approx(0.5, abs=0.01)


def test_deactivate_removes_hook_and_attribute():
    model = TinyLM().train()
    handle = activate_neftune(model, 5.0)
    assert isinstance(handle, NeftuneHandle) and handle.active
    assert _hooks(model.embed) == 1 and getattr(model.embed, ALPHA_ATTR) == 5.0
    deactivate_neftune(model, handle)
    assert _hooks(model.embed) == 0 and not hasattr(model.embed, ALPHA_ATTR)
    deactivate_neftune(model, handle)  # idempotent
    ids = _ids()
    assert torch.equal(model.embed(ids), model.embed(ids))  # no noise any more


def test_plain_removable_handle_is_accepted():
    model = TinyLM()
    handle = activate_neftune(model, 1.0)
    deactivate_neftune(model, handle.hook)
    assert _hooks(model.embed) == 0 and not hasattr(model.embed, ALPHA_ATTR)


def test_context_manager_removes_hook_on_error():
    model = TinyLM().train()
    with pytest.raises(RuntimeError, match="boom"), neftune(model, 5.0):
        assert _hooks(model.embed) == 1
        raise RuntimeError("boom")
    assert _hooks(model.embed) == 0 and not hasattr(model.embed, ALPHA_ATTR)
    with pytest.raises(RuntimeError), activate_neftune(model, 5.0):  # the handle itself is a context manager
        raise RuntimeError("boom")
    assert _hooks(model.embed) == 0 and not hasattr(model.embed, ALPHA_ATTR)


def test_none_alpha_context_is_a_no_op():
    model = TinyLM()
    with neftune(model, None) as handle:
        assert handle is None and _hooks(model.embed) == 0


def test_double_activation_is_refused():
    model = TinyLM()
    with neftune(model, 5.0), pytest.raises(ValueError, match="already active"):
        activate_neftune(model, 5.0)


@pytest.mark.parametrize("model", [nn.Linear(2, 2), NoEmbeddings()], ids=["no-method", "returns-None"])
def test_model_without_input_embeddings_gets_a_clear_error(model):
    with pytest.raises(ValueError) as err:
        activate_neftune(model, 5.0)
    message = str(err.value)
    assert "neftune_noise_alpha" in message and type(model).__name__ in message
    assert "get_input_embeddings()" in message and "unset" in message


def test_not_implemented_input_embeddings_gets_a_clear_error():
    class Base(nn.Module):
        def get_input_embeddings(self):
            raise NotImplementedError

    with pytest.raises(ValueError, match="Base has get_input_embeddings"):
        activate_neftune(Base(), 5.0)


@pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), float("inf"), "5", True, None])
def test_bad_alpha_is_refused(alpha):
    with pytest.raises(ValueError, match="neftune_noise_alpha must be a positive finite number"):
        activate_neftune(TinyLM(), alpha)


def test_int_alpha_is_accepted_as_float():
    model = TinyLM()
    with neftune(model, 5):
        assert getattr(model.embed, ALPHA_ATTR) == 5.0 and isinstance(getattr(model.embed, ALPHA_ATTR), float)


@pytest.mark.parametrize(
    "wrap",
    [Wrapper, lambda m: Wrapper(Wrapper(m)), PeftModel, lambda m: Wrapper(PeftModel(m)), torch.compile],
    ids=["ddp", "nested", "peft", "ddp-peft", "compile"],
)
@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.jit")  # importing torch._dynamo, not our code
def test_wrappers_are_looked_through(wrap):
    model = TinyLM()
    assert find_input_embeddings(wrap(model)) is model.embed


def test_accelerator_unwrap_is_used():
    model = TinyLM()
    accelerator = SimpleNamespace(unwrap_model=lambda wrapped: wrapped.inner)
    assert find_input_embeddings(SimpleNamespace(inner=model), accelerator) is model.embed


def test_submodule_named_module_is_not_taken_for_a_wrapper():
    model = TinyLM()
    model.module = nn.Linear(2, 2)  # a user's own submodule, not a DDP wrapper
    assert find_input_embeddings(model) is model.embed


def test_non_tensor_embedding_output_gets_a_clear_error():
    class TupleEmbedding(nn.Embedding):
        def forward(self, ids):
            return (super().forward(ids),)

    model = TinyLM()
    model.embed = TupleEmbedding(64, 16)
    with neftune(model, 5.0), pytest.raises(TypeError, match="neftune_noise_alpha"):
        model.train()(_ids())


# --- parity with the reference ------------------------------------------------------------------------------


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).train()


def _noisy_run(model, activate, deactivate, dtype=torch.float32):
    ids = torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(1))
    handle = activate(model.to(dtype), 5.0)
    try:
        torch.manual_seed(123)
        embeds = model.get_input_embeddings()(ids)
        logits = model(input_ids=ids).logits
        after = torch.rand(4)  # the global RNG must be left in the same state too
    finally:
        deactivate(model, handle)
    return embeds, logits, after


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitwise_equal_to_reference(dtype):
    model = _tiny_llama()
    from transformers.integrations import neftune as reference

    ours = _noisy_run(model, activate_neftune, deactivate_neftune, dtype)
    theirs = _noisy_run(model, reference.activate_neftune, reference.deactivate_neftune, dtype)
    for mine, ref in zip(ours, theirs):
        assert torch.equal(mine, ref)
    assert _hooks(model.get_input_embeddings()) == 0 and not hasattr(model.get_input_embeddings(), ALPHA_ATTR)


def test_reference_hook_and_ours_interoperate_on_the_attribute():
    model = _tiny_llama()
    from transformers.integrations import neftune as reference

    ref_handle = reference.activate_neftune(model, 5.0)
    with pytest.raises(ValueError, match="already active"):  # ours sees the reference's activation
        activate_neftune(model, 5.0)
    deactivate_neftune(model, ref_handle)  # and removes it from the reference's plain handle
    assert _hooks(model.get_input_embeddings()) == 0 and not hasattr(model.get_input_embeddings(), ALPHA_ATTR)
    handle = activate_neftune(model, 5.0)
    reference.deactivate_neftune(model, handle.hook)  # the reference's deactivate accepts our hook
    assert _hooks(model.get_input_embeddings()) == 0 and not hasattr(model.get_input_embeddings(), ALPHA_ATTR)
