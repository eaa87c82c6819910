"""Learning-rate schedulers: shapes against values taken once from the reference (transformers 5.23), argument
errors, GreedyLR behaviour, and state_dict round trips through ``torch.load(weights_only=True)``."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

import pytest
import torch

from trainwell.optim import schedules
from trainwell.optim.greedy import GreedyLR
from trainwell.optim.layerwise import LayerWiseDummyOptimizer, LayerWiseDummyScheduler
from trainwell.optim.schedulers import (
    TYPE_TO_SCHEDULER_FUNCTION,
    get_constant_schedule,
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_cosine_with_hard_restarts_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup_lr_rate,
    get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup,
    get_polynomial_decay_schedule_with_warmup,
    get_reduce_on_plateau_schedule,
    get_scheduler,
    get_wsd_schedule,
)
from trainwell.outputs import SchedulerType

LR, WARMUP, TOTAL = 0.1, 4, 20
# step 0, mid-warmup, end of warmup, middle, one before the end, the end, past the end
KEY_STEPS = (0, 2, 4, 12, 19, 20, 23)

# (lr_scheduler_type, lr_scheduler_kwargs, {step: LR}) with lr=0.1, 4 warmup steps, 20 training steps.
# Values were produced by transformers 5.23's get_scheduler with the same arguments.
REFERENCE_LRS = [
    ("linear", {}, {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.05, 19: 0.00625, 20: 0.0, 23: 0.0}),
    ("cosine", {}, {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.05, 19: 0.0009607359798384785, 20: 0.0, 23: 0.008426519384872728}),
    ("cosine", {"num_cycles": 1.5},
     {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.04999999999999999, 19: 0.008426519384872743, 20: 0.0, 23: 0.05975451610080636}),
    ("cosine_with_restarts", {"num_cycles": 2},
     {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.1, 19: 0.0038060233744356634, 20: 0.0, 23: 0.0}),
    ("polynomial", {"power": 2.0, "lr_end": 0.001},
     {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.025750000000000002, 19: 0.00138671875, 20: 0.001, 23: 0.001}),
    ("constant", {}, {0: 0.1, 2: 0.1, 4: 0.1, 12: 0.1, 19: 0.1, 20: 0.1, 23: 0.1}),
    ("constant_with_warmup", {}, {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.1, 19: 0.1, 20: 0.1, 23: 0.1}),
    ("inverse_sqrt", {},
     {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.05773502691896259, 19: 0.04588314677411235, 20: 0.044721359549995794,
      23: 0.04170288281141496}),
    ("inverse_sqrt", {"timescale": 10},
     {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.07453559924999299, 19: 0.0632455532033676, 20: 0.06201736729460422,
      23: 0.05872202195147035}),
    ("cosine_with_min_lr", {"min_lr": 0.01},
     {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.05500000000000001, 19: 0.01086466238185463, 20: 0.01, 23: 0.017583867446385456}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.2},
     {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.06000000000000001, 19: 0.020768588783870785, 20: 0.020000000000000004,
      23: 0.026741215507898188}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1},
     {0: 0.025, 2: 0.07500000000000001, 4: 0.09913533761814537, 12: 0.04622093550927423, 19: 0.010000000000000002,
      20: 0.010864662381854632, 23: 0.023180194846605356}),
    ("cosine_warmup_with_min_lr", {"min_lr": 0.02, "warmup_lr_rate": 0.3},
     {0: 0.03, 2: 0.07666666666666666, 4: 0.09923141121612922, 12: 0.05219638711935487, 19: 0.02,
      20: 0.020768588783870782, 23: 0.03171572875253809}),
    ("warmup_stable_decay", {"num_decay_steps": 6},
     {0: 0.0, 2: 0.05, 4: 0.1, 12: 0.1, 19: 0.006698729810778065, 20: 0.0, 23: 0.0}),
    ("warmup_stable_decay",
     {"num_decay_steps": 8, "warmup_type": "cosine", "decay_type": "linear", "min_lr_ratio": 0.1},
     {0: 0.010000000000000002, 2: 0.05499999999999999, 4: 0.1, 12: 0.1, 19: 0.021250000000000005,
      20: 0.010000000000000002, 23: 0.010000000000000002}),
    ("warmup_stable_decay",
     {"num_decay_steps": 8, "num_stable_steps": 4, "warmup_type": "1-sqrt", "decay_type": "1-sqrt"},
     {0: 0.0, 2: 0.029289321881345243, 4: 0.1, 12: 0.029289321881345243, 19: 0.0, 20: 0.0, 23: 0.0}),
]  # fmt: skip


CASE_IDS = [f"{name}-{i}" for i, (name, _, _) in enumerate(REFERENCE_LRS)]


def make_optimizer(lr: float = LR, groups: int = 1) -> torch.optim.Optimizer:
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(groups)]
    return torch.optim.SGD([{"params": [p], "lr": lr * (i + 1)} for i, p in enumerate(params)], lr=lr)


def lr_trace(scheduler, optimizer, steps: int) -> list[float]:
    """LR seen by each optimizer step 0..steps (the step-0 LR is the one before any scheduler.step())."""
    trace = [scheduler.get_last_lr()[0]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        trace.append(scheduler.get_last_lr()[0])
    return trace


@pytest.mark.parametrize("name, kwargs, expected", REFERENCE_LRS, ids=CASE_IDS)
def test_schedule_matches_reference_at_key_steps(name, kwargs, expected):
    opt = make_optimizer()
    scheduler = get_scheduler(name, opt, num_warmup_steps=WARMUP, num_training_steps=TOTAL,
                              scheduler_specific_kwargs=kwargs)  # fmt: skip
    trace = lr_trace(scheduler, opt, max(KEY_STEPS))
    for step in KEY_STEPS:
        assert trace[step] == pytest.approx(expected[step], rel=1e-12, abs=1e-15), f"step {step}"


def test_every_scheduler_type_is_registered():
    assert set(TYPE_TO_SCHEDULER_FUNCTION) == set(SchedulerType)
    assert {name for name, _, _ in REFERENCE_LRS} == {t.value for t in SchedulerType} - {
        "reduce_lr_on_plateau",
        "greedy",
    }


def test_public_builders_equal_get_scheduler():
    builders = {
        "linear": lambda o: get_linear_schedule_with_warmup(o, WARMUP, TOTAL),
        "cosine": lambda o: get_cosine_schedule_with_warmup(o, WARMUP, TOTAL),
        "cosine_with_restarts": lambda o: get_cosine_with_hard_restarts_schedule_with_warmup(o, WARMUP, TOTAL, 2),
        "polynomial": lambda o: get_polynomial_decay_schedule_with_warmup(o, WARMUP, TOTAL, lr_end=0.001, power=2.0),
        "constant": get_constant_schedule,
        "constant_with_warmup": lambda o: get_constant_schedule_with_warmup(o, WARMUP),
        "inverse_sqrt": lambda o: get_inverse_sqrt_schedule(o, WARMUP),
        "cosine_with_min_lr": lambda o: get_cosine_with_min_lr_schedule_with_warmup(o, WARMUP, TOTAL, min_lr=0.01),
        "cosine_warmup_with_min_lr": lambda o: get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
            o, WARMUP, TOTAL, min_lr_rate=0.1
        ),
        "warmup_stable_decay": lambda o: get_wsd_schedule(o, WARMUP, 6, num_training_steps=TOTAL),
    }
    firsts = {}
    for name, _kwargs, expected in REFERENCE_LRS:
        if name in builders and name not in firsts:
            firsts[name] = expected
            opt = make_optimizer()
            trace = lr_trace(builders[name](opt), opt, max(KEY_STEPS))
            assert [trace[s] for s in KEY_STEPS] == pytest.approx([expected[s] for s in KEY_STEPS], rel=1e-12)
    assert set(firsts) == set(builders)


def test_pure_schedule_functions():
    assert schedules.linear(5, num_warmup_steps=10, num_training_steps=20) == 0.5
    assert schedules.linear(15, num_warmup_steps=10, num_training_steps=20) == 0.5
    assert schedules.cosine(10, num_warmup_steps=0, num_training_steps=20) == pytest.approx(0.5)
    assert schedules.inverse_sqrt(40, num_warmup_steps=10, timescale=10) == pytest.approx(0.5)
    assert schedules.warmup_stable_decay(
        7, num_warmup_steps=2, num_stable_steps=3, num_decay_steps=4, decay_type="linear"
    ) == pytest.approx(0.5)
    # T == W: the reference divides by zero here; the decay is then simply skipped.
    kw = {"num_warmup_steps": 5, "num_training_steps": 5, "lr_end": 0.0, "power": 1.0, "lr_init": 1.0}
    assert schedules.polynomial(5, **kw) == 1.0


def test_multiple_param_groups_scale_their_own_lr():
    opt = make_optimizer(groups=2)
    scheduler = get_scheduler("linear", opt, num_warmup_steps=0, num_training_steps=10)
    for _ in range(5):
        opt.step()
        scheduler.step()
    assert scheduler.get_last_lr() == pytest.approx([0.05, 0.1])


def test_constant_ignores_warmup_and_says_so(caplog):
    opt = make_optimizer()
    with caplog.at_level(logging.WARNING):
        scheduler = get_scheduler("constant", opt, num_warmup_steps=5, num_training_steps=10)
    assert lr_trace(scheduler, opt, 3) == [LR] * 4
    assert "ignores num_warmup_steps" in caplog.text


@pytest.mark.parametrize("name", ["linear", "cosine", "cosine_with_restarts", "polynomial", "cosine_with_min_lr",
                                  "cosine_warmup_with_min_lr"])  # fmt: skip
def test_missing_num_training_steps_is_named(name):
    kwargs = {"min_lr_rate": 0.1} if "min_lr" in name else {}
    with pytest.raises(ValueError, match=f"num_training_steps is required for the '{name}' scheduler"):
        get_scheduler(name, make_optimizer(), num_warmup_steps=0, scheduler_specific_kwargs=kwargs)


@pytest.mark.parametrize("name", ["linear", "constant_with_warmup", "inverse_sqrt", "warmup_stable_decay"])
def test_missing_num_warmup_steps_is_named(name):
    with pytest.raises(ValueError, match=f"num_warmup_steps is required for the '{name}' scheduler"):
        get_scheduler(name, make_optimizer(), num_training_steps=10)


def test_wsd_without_num_decay_steps_is_a_clear_value_error():
    with pytest.raises(ValueError, match="num_decay_steps is required for the 'warmup_stable_decay' scheduler"):
        get_scheduler("warmup_stable_decay", make_optimizer(), num_warmup_steps=2, num_training_steps=10)


def test_wsd_argument_checks():
    opt = make_optimizer()
    with pytest.raises(ValueError, match="decay_type='exp'"):
        get_wsd_schedule(opt, 2, 3, num_training_steps=10, decay_type="exp")
    with pytest.raises(ValueError, match="num_training_steps or num_stable_steps"):
        get_wsd_schedule(opt, 2, 3)
    with pytest.warns(UserWarning, match="using num_stable_steps"):
        get_wsd_schedule(opt, 2, 3, num_training_steps=10, num_stable_steps=1)


@pytest.mark.parametrize("name", ["cosine_with_min_lr", "cosine_warmup_with_min_lr"])
@pytest.mark.parametrize("kwargs, got", [({}, "neither"), ({"min_lr": 1e-3, "min_lr_rate": 0.1}, "both")])
def test_min_lr_needs_exactly_one_floor(name, kwargs, got):
    with pytest.raises(ValueError, match=f"exactly one of min_lr .* got {got}"):
        get_scheduler(name, make_optimizer(), 0, 10, scheduler_specific_kwargs=kwargs)


def test_unknown_kwarg_lists_accepted_ones():
    with pytest.raises(TypeError, match=r"\['power'\] are not accepted by the 'cosine' scheduler.*num_cycles"):
        get_scheduler("cosine", make_optimizer(), 0, 10, scheduler_specific_kwargs={"power": 2})
    with pytest.raises(TypeError, match="'reduce_lr_on_plateau'"):
        get_scheduler("reduce_lr_on_plateau", make_optimizer(), scheduler_specific_kwargs={"num_cycles": 2})


def test_unknown_scheduler_name_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown lr_scheduler_type 'cosine_annealing'.*'warmup_stable_decay'"):
        get_scheduler("cosine_annealing", make_optimizer(), 0, 10)


def test_polynomial_needs_lr_end_below_lr():
    with pytest.raises(ValueError, match="lr_end=0.5 must be smaller"):
        get_scheduler("polynomial", make_optimizer(), 0, 10, scheduler_specific_kwargs={"lr_end": 0.5})


def test_scheduler_type_enum_is_accepted():
    opt = make_optimizer()
    scheduler = get_scheduler(SchedulerType.COSINE, opt, num_warmup_steps=WARMUP, num_training_steps=TOTAL)
    assert lr_trace(scheduler, opt, 12)[12] == pytest.approx(0.05)


def roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("name, kwargs, expected", REFERENCE_LRS, ids=CASE_IDS)
def test_state_dict_survives_weights_only_load_and_resumes_identically(name, kwargs, expected):
    def build():
        opt = make_optimizer(groups=2)
        return opt, get_scheduler(name, opt, WARMUP, TOTAL, scheduler_specific_kwargs=kwargs)

    opt, scheduler = build()
    full = [scheduler.get_last_lr()]
    for step in range(TOTAL + 3):
        opt.step()
        scheduler.step()
        full.append(scheduler.get_last_lr())
        if step == 6:
            saved_opt, saved_sched = roundtrip(opt.state_dict()), roundtrip(scheduler.state_dict())

    opt2, scheduler2 = build()
    opt2.load_state_dict(saved_opt)
    scheduler2.load_state_dict(saved_sched)
    resumed = [scheduler2.get_last_lr()]
    for _ in range(TOTAL + 3 - 7):
        opt2.step()
        scheduler2.step()
        resumed.append(scheduler2.get_last_lr())
    assert resumed == full[7:]
    assert [g["lr"] for g in opt2.param_groups] == full[-1]


def test_reduce_on_plateau_passes_kwargs_and_round_trips():
    opt = make_optimizer()
    scheduler = get_scheduler("reduce_lr_on_plateau", opt, scheduler_specific_kwargs={"patience": 0, "factor": 0.5})
    assert isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    for metric in (1.0, 1.0, 1.0):
        scheduler.step(metric)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    fresh = get_reduce_on_plateau_schedule(make_optimizer(), patience=0, factor=0.5)
    fresh.load_state_dict(roundtrip(scheduler.state_dict()))
    assert fresh.num_bad_epochs == scheduler.num_bad_epochs and fresh.best == scheduler.best


# (GreedyLR kwargs, metrics fed after each evaluation, group-0 LR after each) from transformers 5.23's GreedyLR,
# with an SGD optimizer at lr=0.1.
GREEDY_REFERENCE = [
    ({"patience": 2, "factor": 0.5, "min_lr": 0.01, "max_lr": 0.5, "cooldown": 1, "warmup": 1},
     [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.45, 0.44, 0.44, 0.44, 0.44, 0.44, 0.44, 0.44, 0.44],
     [0.1, 0.1, 0.2, 0.2, 0.2, 0.2, 0.4, 0.4, 0.4, 0.4, 0.4, 0.2, 0.2, 0.2, 0.2]),
    ({"patience": 0, "factor": 0.5, "min_lr": 0.05, "reset_start": 2},
     [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
     [0.2, 0.1, 0.05, 0.1, 0.2, 0.1, 0.05]),
    ({"patience": 0, "factor": 0.5, "min_lr": 0.01, "smooth": True, "window_size": 2},
     [1.0, 0.5, 2.0, 2.0, 0.1, 0.1, 0.1],
     [0.2, 0.4, 0.2, 0.1, 0.05, 0.1, 0.05]),
    ({"patience": 1, "factor": 0.5, "min_lr": 0.01, "mode": "max", "threshold_mode": "rel", "threshold": 0.1},
     [1.0, 1.05, 1.2, 1.4, 1.41, 1.42, 1.43],
     [0.1, 0.1, 0.1, 0.2, 0.2, 0.1, 0.1]),
]  # fmt: skip


@pytest.mark.parametrize("kwargs, metrics, expected", GREEDY_REFERENCE)
def test_greedy_matches_reference(kwargs, metrics, expected):
    opt = make_optimizer()
    scheduler = get_scheduler("greedy", opt, scheduler_specific_kwargs=kwargs)
    trace = []
    for metric in metrics:
        scheduler.step(metric)
        trace.append(scheduler.get_last_lr()[0])
        assert opt.param_groups[0]["lr"] == trace[-1]
    assert trace == pytest.approx(expected, rel=1e-12)


def test_greedy_state_dict_round_trip_resumes_identically():
    kwargs, metrics, _ = GREEDY_REFERENCE[2]
    opt = make_optimizer(groups=2)
    scheduler = GreedyLR(opt, **kwargs)
    for metric in metrics[:3]:
        scheduler.step(metric)
    state = roundtrip(scheduler.state_dict())
    rest = [scheduler.step(m) or scheduler.get_last_lr() for m in metrics[3:]]

    opt2 = make_optimizer(groups=2)
    scheduler2 = GreedyLR(opt2, **kwargs)
    scheduler2.load_state_dict(state)  # also restores the optimizer's LRs
    assert [g["lr"] for g in opt2.param_groups] == state["_last_lr"]
    assert [scheduler2.step(m) or scheduler2.get_last_lr() for m in metrics[3:]] == rest


def test_greedy_argument_checks_and_low_min_lr_warning(caplog):
    opt = make_optimizer()
    with pytest.raises(ValueError, match="factor=1.0"):
        GreedyLR(opt, factor=1.0)
    with pytest.raises(ValueError, match="mode='up'"):
        GreedyLR(opt, mode="up")
    with pytest.raises(ValueError, match="threshold_mode='pct'"):
        GreedyLR(opt, threshold_mode="pct")
    with pytest.raises(ValueError, match="expected 1 min_lrs"):
        GreedyLR(opt, min_lr=[0.1, 0.2])
    with pytest.raises(TypeError, match="not a torch.optim.Optimizer"):
        GreedyLR(object())
    with caplog.at_level(logging.WARNING):
        GreedyLR(make_optimizer(lr=5e-5))
    assert "min_lr=0.001 is above the initial learning rate" in caplog.text


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_layerwise_optimizer_gets_per_parameter_schedulers():
    params = [torch.nn.Parameter(torch.ones(2)) for _ in range(2)]
    inner = {p: torch.optim.SGD([p], lr=0.1) for p in params}
    scheduler = get_scheduler("linear", LayerWiseDummyOptimizer(inner, lr=0.1), 0, 4)
    assert isinstance(scheduler, LayerWiseDummyScheduler)
    for _ in range(2):  # the hooks step each parameter's scheduler once per backward
        (params[0].sum() + params[1].sum()).backward()
    assert [o.param_groups[0]["lr"] for o in inner.values()] == pytest.approx([0.05, 0.05])
    assert scheduler.get_last_lr() == [0.1]  # captured at construction; the stand-in is never stepped


def test_importing_optim_modules_stays_cheap():
    code = (
        "import sys, trainwell.optim.schedulers, trainwell.optim.registry; "
        "print(sorted(m for m in ('accelerate', 'transformers', 'bitsandbytes', 'torchao') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
