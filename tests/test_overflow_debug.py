"""The inf/nan debugger (trainwell.techniques.overflow, also at trainwell.debug_utils): detection and its report,
tracing, early abort, hook removal, and (when transformers is installed) the same printed report as the
reference's ``transformers.debug_utils.DebugUnderflowOverflow``."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from torch import nn

from trainwell.techniques.overflow import DebugOption, DebugUnderflowOverflow, detect_overflow, get_abs_min_max


def make_model(overflow: bool = False) -> nn.Sequential:
    """Linear -> ReLU -> (Linear -> Dropout) -> Linear; with ``overflow`` the inner Linear's weights are ~1e38, so
    its float32 output is inf for inputs of 1e4."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0)), nn.Linear(4, 2))
    if overflow:
        with torch.no_grad():
            model[2][0].weight.mul_(1e38)
    return model


BIG = torch.full((2, 4), 1e4)


def _hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


def test_overflow_raises_and_reports_the_module(capsys):
    model = make_model(overflow=True)
    DebugUnderflowOverflow(model)
    with pytest.raises(ValueError, match=r"inf/nan detected at '2\.0' \(Linear\) during batch_number=0"):
        model(BIG)
    out = capsys.readouterr().out
    assert "output has infs" in out
    assert "Detected inf/nan during batch_number=0" in out
    assert "Last 3 forward frames:" in out
    assert "abs min  abs max  metadata" in out
    assert "*** Starting batch number=0 ***" in out
    for header in ("0 Linear", "1 ReLU", "2.0 Linear"):
        assert f"{' ' * 17} {header}\n" in out
    assert "     inf      inf output" in out
    assert "1.00e+04 1.00e+04 input[0]" in out  # the first Linear's input, formatted %8.2e
    assert "2.1 Dropout" not in out  # nothing after the offending module ran


def test_nan_is_detected(capsys):
    model = make_model()
    with torch.no_grad():
        model[3].bias[0] = float("nan")
    DebugUnderflowOverflow(model)
    with pytest.raises(ValueError, match="'3' \\(Linear\\)"):
        model(torch.ones(2, 4))
    out = capsys.readouterr().out
    assert "bias has nans" in out and "output has nans" in out


def test_healthy_model_runs_silently(capsys):
    model = make_model()
    debug = DebugUnderflowOverflow(model)
    for _ in range(3):
        model(torch.ones(2, 4))
    assert capsys.readouterr().out == ""
    assert debug.batch_number == 3 and debug.total_calls == 3 * len(list(model.modules()))


def test_frame_buffer_is_bounded(capsys):
    model = make_model(overflow=True)
    debug = DebugUnderflowOverflow(model, max_frames_to_save=2)
    with pytest.raises(ValueError):
        model(BIG)
    out = capsys.readouterr().out
    assert "Last 2 forward frames:" in out and f"{' ' * 17} 0 Linear" not in out and "1 ReLU" in out
    assert len(debug.frames) == 0 and debug.frames.maxlen == 2  # dumped, and still bounded


def test_trace_batch_nums_prints_only_those_batches(capsys):
    model = make_model()
    DebugUnderflowOverflow(model, trace_batch_nums=[1])
    for _ in range(3):
        model(torch.ones(2, 4))
    out = capsys.readouterr().out
    assert "*** Starting batch number=1 ***" in out
    assert "batch number=0" not in out and "batch number=2" not in out
    for header in (" 0 Linear", " 1 ReLU", " 2.0 Linear", " 2.1 Dropout", " 2 Sequential", " 3 Linear", " Sequential"):
        assert out.count(f"{' ' * 16}{header}\n") == 1, header


def test_traced_batch_does_not_raise_but_the_next_one_does(capsys):
    model = make_model(overflow=True)
    DebugUnderflowOverflow(model, trace_batch_nums=[0])
    model(BIG)  # traced: printed, no error
    assert "output has infs" in capsys.readouterr().out
    with pytest.raises(ValueError, match="inf/nan detected"):  # detection is back on (and the flag is sticky)
        model(BIG)


def test_abort_after_batch_num():
    model = make_model()
    debug = DebugUnderflowOverflow(model, abort_after_batch_num=1)
    model(torch.ones(2, 4))  # batch 0
    with pytest.raises(ValueError, match="abort_after_batch_num=1"):
        model(torch.ones(2, 4))  # batch 1: raises once its forward has finished
    assert debug.batch_number == 2


def test_detach_removes_every_hook():
    model = make_model(overflow=True)
    assert _hook_count(model) == 0
    debug = DebugUnderflowOverflow(model)
    assert debug.attached and _hook_count(model) == len(list(model.modules()))
    debug.detach()
    debug.detach()  # idempotent
    assert not debug.attached and _hook_count(model) == 0
    model(BIG)  # no longer watched: no error


def test_context_manager_detaches_on_error():
    model = make_model(overflow=True)
    with pytest.raises(ValueError), contextlib.redirect_stdout(io.StringIO()), DebugUnderflowOverflow(model):
        model(BIG)
    assert _hook_count(model) == 0


def test_shared_module_is_hooked_once():
    shared = nn.Linear(2, 2)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    DebugUnderflowOverflow(model)
    assert len(shared._forward_hooks) == 1


def test_non_tensor_values_and_integer_inputs(capsys):
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 3)

        def forward(self, ids, mask=None):
            return self.embed(ids), (None, 3)

    model = Odd()
    DebugUnderflowOverflow(model, trace_batch_nums=[0])
    model(torch.tensor([[1, 9]]), None)
    out = capsys.readouterr().out
    assert "1.00e+00 9.00e+00 input[0]" in out  # int64 ids formatted like floats
    assert f"{'None':>17} input[1]" in out
    assert f"{'None':>17} output[1][0]" in out and f"{'not a tensor':>17} output[1][1]" in out


def test_helpers():
    assert get_abs_min_max(torch.tensor([-3.0, 0.5]), "x") == "5.00e-01 3.00e+00 x"
    assert get_abs_min_max(torch.tensor([True, False]), "m") == "0.00e+00 1.00e+00 m"
    assert get_abs_min_max(torch.empty(0), "e").endswith("empty e")
    assert not detect_overflow(torch.ones(3), "x")
    assert detect_overflow(torch.tensor([1.0, float("-inf")]), "x")


def test_debug_option():
    assert DebugOption("underflow_overflow") is DebugOption.UNDERFLOW_OVERFLOW
    assert DebugOption.TPU_METRICS_DEBUG.value == "tpu_metrics_debug"
    assert DebugOption.UNDERFLOW_OVERFLOW in ["underflow_overflow"]  # TrainingArguments.debug holds plain strings
    with pytest.raises(ValueError, match="underflow_overflow"):
        DebugOption("overflow")


def test_reference_path_reexports():
    import trainwell.debug_utils as debug_utils
    from trainwell.techniques import overflow

    for name in ("DebugUnderflowOverflow", "DebugOption", "get_abs_min_max", "detect_overflow"):
        assert getattr(debug_utils, name) is getattr(overflow, name)
    assert set(debug_utils.__all__) == {"DebugUnderflowOverflow", "DebugOption", "detect_overflow", "get_abs_min_max"}


# --- parity with the reference ------------------------------------------------------------------------------


def _run(cls, batches, overflow, **kwargs):
    """Printed output and error type of ``batches`` forwards of a fresh model watched by ``cls``."""
    model = make_model(overflow)
    cls(model, **kwargs)
    out, error = io.StringIO(), None
    with contextlib.redirect_stdout(out):
        try:
            for _ in range(batches):
                model(BIG if overflow else torch.ones(2, 4))
        except ValueError as err:
            error = type(err)
    return out.getvalue(), error


@pytest.mark.parametrize(
    ("batches", "overflow", "kwargs"),
    [
        (1, True, {}),
        (1, True, {"max_frames_to_save": 2}),
        (3, False, {"trace_batch_nums": [0, 2]}),
        (2, True, {"trace_batch_nums": [0]}),
        (4, False, {"trace_batch_nums": [1], "abort_after_batch_num": 1}),
    ],
    ids=["overflow", "few-frames", "trace", "trace-then-detect", "abort"],
)
def test_same_report_as_reference(batches, overflow, kwargs):
    reference = pytest.importorskip("transformers.debug_utils")
    ours = _run(DebugUnderflowOverflow, batches, overflow, **kwargs)
    theirs = _run(reference.DebugUnderflowOverflow, batches, overflow, **kwargs)
    assert ours == theirs
    assert ours[1] is (ValueError if overflow or "abort_after_batch_num" in kwargs else None)


def test_same_module_named_as_reference_on_a_transformers_model():
    transformers = pytest.importorskip("transformers")
    from transformers.debug_utils import DebugUnderflowOverflow as Reference

    config = transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    reports = []
    for cls in (DebugUnderflowOverflow, Reference):
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(config)
        with torch.no_grad():
            model.transformer.h[0].mlp.c_fc.weight.normal_().mul_(1e38)  # |w.x| ~ 4e38: inf
        cls(model)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(ValueError):
            model(torch.tensor([[1, 2, 3]]))
        reports.append(out.getvalue())
    assert reports[0] == reports[1]
    assert "transformer.h.0.mlp.c_fc Conv1D" in reports[0]
