"""The optimizer registry, weight-decay parameter groups and Adafactor.

Expected kwargs, decay names and Adafactor parameter values were taken once from transformers 5.23 with the
same inputs; optional packages are replaced by fake modules to pin the kwargs the registry builds for them.
"""

from __future__ import annotations

import importlib.util
import io
import sys
import types
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainwell.optim.adafactor import Adafactor, AdafactorSchedule
from trainwell.optim.layerwise import LayerWiseDummyOptimizer
from trainwell.optim.param_groups import build_param_groups, get_decay_parameter_names, get_parameter_names
from trainwell.optim.registry import (
    OPTIMIZERS,
    create_optimizer,
    get_optimizer_cls_and_kwargs,
    parse_optim_args,
)
from trainwell.optim.schedulers import get_scheduler
from trainwell.outputs import OptimizerNames


def make_args(**overrides) -> SimpleNamespace:
    values = dict(optim="adamw_torch", optim_args=None, learning_rate=3e-4, adam_beta1=0.8, adam_beta2=0.95,
                  adam_epsilon=1e-7, weight_decay=0.1, optim_target_modules=None, warmup_steps=5,
                  gradient_accumulation_steps=1, parallel_mode="not_parallel")  # fmt: skip
    values.update(overrides)
    return SimpleNamespace(**values)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(4, 4)
        self.ln = nn.LayerNorm(4)
        self.rms = nn.RMSNorm(4)
        self.q_norm = nn.Linear(4, 4, bias=False)
        self.post_attention_layernorm = nn.Linear(4, 4, bias=False)
        self.normalizer = nn.Linear(4, 4, bias=False)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2, bias=False)
        self.scale = nn.Parameter(torch.ones(1))
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)


def regression_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 1))


# ---- parse_optim_args ---------------------------------------------------------------------------------------


def test_parse_optim_args_coerces_values():
    parsed = parse_optim_args("momentum=0.9, nesterov=True,rank=8,proj_type=std,eps=1e-8,flag=false,path=a=b")
    assert parsed == {"momentum": 0.9, "nesterov": True, "rank": 8, "proj_type": "std", "eps": 1e-8,
                      "flag": False, "path": "a=b"}  # fmt: skip
    assert type(parsed["rank"]) is int
    assert parse_optim_args(None) == {} and parse_optim_args("") == {}


def test_optim_args_as_a_dict_reaches_the_optimizer(out_dir):
    from tests.common.models import RegressionDataset, RegressionModel
    from tests.conftest import make_args
    from trainwell import Trainer

    args = make_args(out_dir, optim="sgd", optim_args={"momentum": "0.5", "nesterov": True})
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=RegressionDataset(length=8))
    group = trainer.create_optimizer().param_groups[0]
    assert group["momentum"] == 0.5 and group["nesterov"] is True
    assert parse_optim_args({"momentum": "0.9", "eps": 1e-8}) == {"momentum": 0.9, "eps": 1e-8}


@pytest.mark.parametrize("bad", ["momentum", "=0.9", "a=1,b"])
def test_parse_optim_args_rejects_items_without_key_and_value(bad):
    with pytest.raises(ValueError, match="is not key=value"):
        parse_optim_args(bad)


# ---- parameter groups ---------------------------------------------------------------------------------------


def test_decay_parameter_names_match_reference_plus_rmsnorm():
    # transformers 5.23 also lists layers.{0,1}.rms.weight: it excludes nn.LayerNorm by type but not nn.RMSNorm.
    assert sorted(get_decay_parameter_names(Net())) == [
        "emb.weight", "frozen.weight", "head.weight", "layers.0.attn.weight", "layers.0.normalizer.weight",
        "layers.1.attn.weight", "layers.1.normalizer.weight", "scale",
    ]  # fmt: skip


def test_get_parameter_names_semantics():
    model = nn.Sequential(nn.LayerNorm(2), nn.Linear(2, 2, bias=False))
    assert get_parameter_names(model, [nn.LayerNorm]) == ["1.weight"]  # the reference also lists "1.bias" (None)
    assert get_parameter_names(nn.LayerNorm(2), [nn.LayerNorm]) == ["weight", "bias"]  # the root is not checked
    nested = nn.ModuleDict({"enc": nn.ModuleDict({"norm": nn.Linear(2, 2)})})
    # "^norm" is searched in the name seen from every enclosing module, so it still hits "enc.norm.weight".
    assert get_parameter_names(nested, [], ["^norm"]) == []
    assert get_parameter_names(nested, [], ["^enc"]) == []
    assert get_parameter_names(nested, [], ["^weight"]) == ["enc.norm.bias"]
    assert get_parameter_names(nested, [], ["^x"]) == ["enc.norm.weight", "enc.norm.bias"]


class _Ordered(nn.Module):
    """Own parameter registered before the children; a child registered twice; a bias-free Linear."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(2))
        self.enc = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
        self.head = nn.Linear(2, 1, bias=False)
        self.shared = self.enc


def test_get_parameter_names_lists_children_first_as_the_reference():
    # Observed on transformers 5.x, which also lists "head.bias" (registered as None; see above).
    assert get_parameter_names(_Ordered(), [nn.LayerNorm]) == ["enc.0.weight", "enc.0.bias", "head.weight", "scale"]
    assert get_parameter_names(_Ordered(), []) == [
        "enc.0.weight", "enc.0.bias", "enc.1.weight", "enc.1.bias", "head.weight", "scale",
    ]  # fmt: skip
    assert get_parameter_names(Net(), [])[:2] == ["emb.weight", "layers.0.attn.weight"]
    assert get_parameter_names(Net(), [])[-3:] == ["frozen.weight", "frozen.bias", "scale"]


def test_get_parameter_names_equals_the_reference_when_installed():
    reference = pytest.importorskip("transformers.trainer_pt_utils").get_parameter_names
    patterns = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
    model = Net()
    existing = {n for n, _ in model.named_parameters()}
    for types_, names in (([nn.LayerNorm], None), ([nn.LayerNorm, nn.RMSNorm], patterns), ([], ["^layers"])):
        # the same names in the same order, less the reference's names of parameters registered as None
        expected = [n for n in reference(model, types_, names) if n in existing]
        assert get_parameter_names(model, types_, names) == expected


def test_build_param_groups_splits_trainable_params():
    model = Net()
    groups = build_param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    decayed = sorted(names[id(p)] for p in groups[0]["params"])
    assert decayed == sorted(set(get_decay_parameter_names(model)) - {"frozen.weight"})
    others = {names[id(p)] for p in groups[1]["params"]}
    assert "layers.0.rms.weight" in others and "layers.1.ln.bias" in others and "frozen.bias" not in others
    assert len(decayed) + len(others) == sum(p.requires_grad for p in model.parameters())


def test_build_param_groups_keeps_the_references_two_groups():
    """Always [decay, no decay], even empty or with weight_decay=0: an optimizer.pt loads into either Trainer."""
    groups = build_param_groups(nn.Linear(2, 2, bias=False), 0.5)
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0] and [len(g["params"]) for g in groups] == [1, 0]
    groups = build_param_groups(nn.Linear(2, 2), 0.0)
    assert [g["weight_decay"] for g in groups] == [0.0, 0.0] and [len(g["params"]) for g in groups] == [1, 1]
    assert build_param_groups(nn.Linear(2, 2).requires_grad_(False), 0.5) == []


# ---- registry: the optimizers that need only torch ----------------------------------------------------------

# (optim, optim_args, class name, kwargs) as built by transformers 5.23 with make_args()'s values.
TORCH_OPTIMIZERS = [
    ("adamw_torch", None, "AdamW", {"lr": 0.0003, "betas": (0.8, 0.95), "eps": 1e-07}),
    ("adamw_torch_fused", None, "AdamW", {"lr": 0.0003, "betas": (0.8, 0.95), "eps": 1e-07, "fused": True}),
    ("adafactor", None, "Adafactor", {"lr": 0.0003, "scale_parameter": False, "relative_step": False}),
    ("sgd", "momentum=0.9,nesterov=True,dampening=0", "SGD",
     {"lr": 0.0003, "momentum": 0.9, "dampening": 0.0, "nesterov": True}),
    ("adagrad", "lr_decay=0.01, eps=1e-8, weight_decay=0.5", "Adagrad",
     {"lr": 0.0003, "lr_decay": 0.01, "weight_decay": 0.5, "eps": 1e-08}),
    ("rmsprop", "momentum=0.5,alpha=0.9,centered=true,eps=1e-7", "RMSprop",
     {"lr": 0.0003, "momentum": 0.5, "alpha": 0.9, "eps": 1e-07, "centered": True}),
]  # fmt: skip


@pytest.mark.parametrize("optim, optim_args, cls_name, expected", TORCH_OPTIMIZERS)
def test_torch_optimizer_kwargs_match_reference(optim, optim_args, cls_name, expected):
    for name in (optim, OptimizerNames(optim)):
        cls, kwargs = get_optimizer_cls_and_kwargs(make_args(optim=name, optim_args=optim_args))
        assert cls.__name__ == cls_name and kwargs == expected


@pytest.mark.parametrize("optim", [row[0] for row in TORCH_OPTIMIZERS])
def test_torch_optimizers_train(optim):
    model = regression_model()
    x = torch.linspace(-1, 1, 48).reshape(16, 3)
    y = x.sum(dim=1, keepdim=True)
    optimizer = create_optimizer(model, make_args(optim=optim, learning_rate=0.05))
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    first = None
    for _ in range(25):
        loss = nn.functional.mse_loss(model(x), y)
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.7 * first


def test_fused_adamw_is_fused():
    optimizer = create_optimizer(regression_model(), make_args(optim="adamw_torch_fused"))
    assert optimizer.defaults["fused"] is True


def test_unused_optim_args_are_reported(caplog):
    get_optimizer_cls_and_kwargs(make_args(optim="sgd", optim_args="momentum=0.9,foo=1"))
    assert "optim='sgd' ignores optim_args ['foo']" in caplog.text


def test_every_optimizer_name_is_registered():
    assert set(OPTIMIZERS) == {name.value for name in OptimizerNames}


def test_unknown_optimizer_name_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown optim 'adamw_apex_fused': choose one of .*adamw_torch_fused"):
        get_optimizer_cls_and_kwargs(make_args(optim="adamw_apex_fused"))


def test_optim_target_modules_with_an_optimizer_that_ignores_it():
    with pytest.raises(ValueError, match=r"optim_target_modules=\['q'\] is only used by the GaLore and APOLLO"):
        get_optimizer_cls_and_kwargs(make_args(optim_target_modules=["q"]))


def test_create_optimizer_with_user_cls_and_kwargs_does_not_mutate_them():
    model = regression_model()
    given = (torch.optim.SGD, {"lr": 0.5, "params": [{"params": list(model.parameters())}]})
    optimizer = create_optimizer(model, make_args(), given)
    assert isinstance(optimizer, torch.optim.SGD) and len(optimizer.param_groups) == 1
    assert "params" in given[1]


def test_create_optimizer_calls_a_factory_with_the_model():
    model = regression_model()
    made = create_optimizer(model, make_args(), (lambda: lambda m, lr: torch.optim.SGD(m.parameters(), lr=lr),
                                                 {"lr": 0.2}))  # fmt: skip
    assert made.defaults["lr"] == 0.2


def test_create_optimizer_without_trainable_parameters():
    with pytest.raises(ValueError, match="no parameter with requires_grad=True"):
        create_optimizer(nn.Linear(2, 2).requires_grad_(False), make_args())


# ---- registry: optional packages ----------------------------------------------------------------------------

OPTIONAL = {
    "bitsandbytes": ["adamw_bnb_8bit", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit", "ademamix",
                     "ademamix_8bit", "paged_ademamix_32bit", "paged_ademamix_8bit", "lion_8bit", "lion_32bit",
                     "paged_lion_32bit", "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit"],
    "torchao": ["adamw_torch_4bit", "adamw_torch_8bit"],
    "galore-torch": ["galore_adamw", "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise",
                     "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise"],
    "apollo-torch": ["apollo_adamw", "apollo_adamw_layerwise"],
    "lomo-optim": ["lomo", "adalomo"],
    "grokadamw": ["grokadamw"],
    "schedulefree": ["schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd"],
    "torch-optimi": ["stable_adamw"],
    "torchdistx": ["adamw_anyprecision"],
    "torch_xla": ["adamw_torch_xla"],
    "torch_npu": ["adamw_torch_npu_fused"],
}  # fmt: skip
MODULE_OF = {"galore-torch": "galore_torch", "apollo-torch": "apollo_torch", "lomo-optim": "lomo_optim",
             "torch-optimi": "optimi"}  # fmt: skip
MISSING = [(optim, pip) for pip, names in OPTIONAL.items() for optim in names]


def test_optional_table_covers_every_other_name():
    assert {o for o, _ in MISSING} | {row[0] for row in TORCH_OPTIMIZERS} == set(OPTIMIZERS)


@pytest.mark.parametrize("optim, pip", MISSING)
def test_missing_package_names_optim_and_pip_command(optim, pip):
    if importlib.util.find_spec(MODULE_OF.get(pip, pip)) is not None:
        pytest.skip(f"{pip} is installed")
    targets = ["0"] if optim.startswith(("galore", "apollo")) else None
    with pytest.raises(ImportError, match=f"optim='{optim}'.*pip install {pip}$"):
        get_optimizer_cls_and_kwargs(make_args(optim=optim, optim_target_modules=targets), regression_model())


class FakeOptimizer(torch.optim.Optimizer):
    def __init__(self, params, **kwargs):
        kwargs.pop("model", None)
        super().__init__(params, kwargs or {"lr": 1e-3})

    def step(self, closure=None):
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.sub_(group["lr"] * p.grad)


@pytest.fixture
def fake_packages(monkeypatch):
    """Install stand-ins for the optional packages; returns the fake bitsandbytes override registry."""
    overrides = []
    manager = SimpleNamespace(register_module_override=lambda m, name, cfg: overrides.append((m, name, cfg)))

    def add(name, *classes):
        module = types.ModuleType(name)
        for cls in classes:
            setattr(module, cls, type(cls, (FakeOptimizer,), {"__module__": name}))
        monkeypatch.setitem(sys.modules, name, module)
        return module

    bnb = add("bitsandbytes")
    bnb.optim = add("bitsandbytes.optim", "AdamW", "Lion", "RMSprop", "AdEMAMix")
    bnb.optim.GlobalOptimManager = SimpleNamespace(get_instance=lambda: manager)
    add("galore_torch", "GaLoreAdamW", "GaLoreAdamW8bit", "GaLoreAdafactor")
    add("apollo_torch", "APOLLOAdamW")
    add("grokadamw", "GrokAdamW")
    add("schedulefree", "AdamWScheduleFree", "SGDScheduleFree", "RAdamScheduleFree")
    add("optimi", "StableAdamW")
    add("torchao")
    add("torchao.optim", "AdamW4bit", "AdamW8bit")
    return overrides


ADAM = {"betas": (0.8, 0.95), "eps": 1e-07}
# Same as transformers 5.23, except that optim_args values reach the constructor coerced (0.9, not "0.9").
FAKE_KWARGS = [
    ("ademamix", "beta3=0.999,alpha=4,t_alpha=100", "AdEMAMix",
     {"lr": 3e-4, "betas": (0.8, 0.95, 0.999), "alpha": 4.0, "eps": 1e-07, "t_alpha": 100, "optim_bits": 32,
      "is_paged": False}),
    ("paged_ademamix_8bit", None, "AdEMAMix",
     {"lr": 3e-4, "betas": (0.8, 0.95, 0.9999), "alpha": 5.0, "eps": 1e-07, "optim_bits": 8, "is_paged": True}),
    ("rmsprop_bnb_8bit", "alpha=0.9,momentum=0.1", "RMSprop",
     {"lr": 3e-4, "alpha": 0.9, "momentum": 0.1, "optim_bits": 8}),
    ("rmsprop_bnb", None, "RMSprop", {"lr": 3e-4, "optim_bits": 32}),
    ("paged_lion_8bit", None, "Lion", {"lr": 3e-4, "betas": (0.8, 0.95), "optim_bits": 8, "is_paged": True}),
    ("adamw_8bit", None, "AdamW", {"lr": 3e-4, **ADAM, "optim_bits": 8, "is_paged": False}),
    ("paged_adamw_32bit", None, "AdamW", {"lr": 3e-4, **ADAM, "optim_bits": 32, "is_paged": True}),
    ("grokadamw", "lamb=3", "GrokAdamW",
     {"lr": 3e-4, "alpha_init": 0.98, "lamb": 3.0, "gamma": 0.1, "grokking_signal_decay_rate": 0.1,
      "gradient_clipping": 1.0}),
    ("schedule_free_radam", "r=0.5", "RAdamScheduleFree",
     {"lr": 3e-4, **ADAM, "weight_decay": 0.1, "weight_lr_power": 2.0, "r": 0.5}),
    ("schedule_free_adamw", "weight_lr_power=1", "AdamWScheduleFree",
     {"lr": 3e-4, **ADAM, "weight_decay": 0.1, "warmup_steps": 5, "weight_lr_power": 1.0, "r": 0.0}),
    ("schedule_free_sgd", None, "SGDScheduleFree",
     {"lr": 3e-4, "weight_decay": 0.1, "warmup_steps": 5, "weight_lr_power": 2.0, "r": 0.0}),
    ("stable_adamw", "max_lr=0.1,decouple_lr=True,kahan_sum=False", "StableAdamW",
     {"lr": 3e-4, **ADAM, "weight_decay": 0.1, "decouple_lr": True, "max_lr": 0.1, "kahan_sum": False}),
    ("adamw_torch_4bit", "block_size=128,bf16_stochastic_round=true", "AdamW4bit",
     {"lr": 3e-4, "block_size": 128, "bf16_stochastic_round": True, **ADAM}),
    ("adamw_torch_8bit", None, "AdamW8bit", {"lr": 3e-4, "block_size": 256, "bf16_stochastic_round": False, **ADAM}),
]  # fmt: skip


@pytest.mark.parametrize("optim, optim_args, cls_name, expected", FAKE_KWARGS)
def test_optional_optimizer_kwargs(fake_packages, optim, optim_args, cls_name, expected):
    cls, kwargs = get_optimizer_cls_and_kwargs(make_args(optim=optim, optim_args=optim_args))
    assert cls.__name__ == cls_name and kwargs == expected


def test_bnb_8bit_keeps_embeddings_in_32bit(fake_packages):
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 4))
    create_optimizer(model, make_args(optim="adamw_bnb_8bit"))
    assert fake_packages == [(model[0], "weight", {"optim_bits": 32})]


class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(4, 4)
        self.k = nn.Linear(4, 4)
        self.act = nn.ReLU()


@pytest.mark.parametrize("targets", [["q"], "q", r".*q"])
def test_galore_targets_linear_weights(fake_packages, targets):
    model = TwoLinear()
    args = make_args(optim="galore_adamw", optim_args="rank=64,scale=0.5", optim_target_modules=targets)
    cls, kwargs = get_optimizer_cls_and_kwargs(args, model)
    others, projected = kwargs["params"]
    assert cls.__name__ == "GaLoreAdamW"
    assert projected == {
        "params": [model.q.weight], "rank": 64, "update_proj_gap": 200, "scale": 0.5, "proj_type": "std"
    }  # fmt: skip
    assert len(others["params"]) == 3


def test_low_rank_argument_errors(fake_packages):
    model = TwoLinear()
    with pytest.raises(ValueError, match="needs optim_target_modules"):
        get_optimizer_cls_and_kwargs(make_args(optim="apollo_adamw"), model)
    with pytest.raises(ValueError, match="no nn.Linear module matches"):
        get_optimizer_cls_and_kwargs(make_args(optim="apollo_adamw", optim_target_modules=["act"]), model)
    with pytest.raises(ValueError, match="needs the model"):
        get_optimizer_cls_and_kwargs(make_args(optim="apollo_adamw", optim_target_modules="all-linear"))
    args = make_args(optim="galore_adamw_layerwise", optim_target_modules="all-linear", gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        get_optimizer_cls_and_kwargs(args, model)


def test_apollo_all_linear_projects_with_adam_kwargs(fake_packages):
    model = TwoLinear()
    args = make_args(optim="apollo_adamw", optim_target_modules="all_linear")
    cls, kwargs = get_optimizer_cls_and_kwargs(args, model)
    assert cls.__name__ == "APOLLOAdamW"
    projected = kwargs["params"][1]
    assert projected["params"] == [model.q.weight, model.k.weight]
    assert {k: v for k, v in projected.items() if k != "params"} == {
        "rank": 128, "proj": "random", "scale_type": "channel", "update_proj_gap": 200, "scale": 1.0,
        "proj_type": "std", **ADAM,
    }  # fmt: skip


def test_layerwise_galore_steps_each_parameter_from_its_gradient_hook(fake_packages):
    model = TwoLinear()
    args = make_args(optim="galore_adafactor_layerwise", optim_target_modules=["q"], learning_rate=0.1)
    optimizer = create_optimizer(model, args)
    assert isinstance(optimizer, LayerWiseDummyOptimizer)
    inner = optimizer.optimizer_dict[model.q.weight]
    assert inner.defaults["relative_step"] is False and inner.param_groups[0]["rank"] == 128
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=2)
    before = model.k.bias.detach().clone()
    (model.q(torch.ones(1, 4)).sum() + model.k(torch.ones(1, 4)).sum()).backward()
    # k.bias got lr 0.1 x grad 1 from its hook, its grad was cleared, and its scheduler halved its LR.
    assert torch.allclose(model.k.bias, before - 0.1) and model.k.bias.grad is None
    assert optimizer.optimizer_dict[model.k.bias].param_groups[0]["lr"] == pytest.approx(0.05)
    optimizer.step()
    scheduler.step()  # no-ops


def test_lomo_is_built_from_the_model(fake_packages, monkeypatch):
    module = types.ModuleType("lomo_optim")
    module.Lomo = module.AdaLomo = FakeOptimizer
    monkeypatch.setitem(sys.modules, "lomo_optim", module)
    model = regression_model()
    assert get_optimizer_cls_and_kwargs(make_args(optim="adalomo"), model)[1] == {"lr": 3e-4, "model": model}
    with pytest.raises(ValueError, match="pass model="):
        get_optimizer_cls_and_kwargs(make_args(optim="lomo"))


# ---- Adafactor ---------------------------------------------------------------------------------------------


class Tiny(nn.Module):
    """Deterministic without any RNG: a 3-D parameter (factored over the last two dims), a matrix and a bias."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.cube = nn.Parameter(torch.zeros(2, 2, 2))
        with torch.no_grad():
            self.lin.weight.copy_(torch.sin(torch.arange(6.0) * 1.3).reshape(2, 3))
            self.lin.bias.copy_(torch.tensor([0.1, -0.2]))
            self.cube.copy_(torch.cos(torch.arange(8.0) * 0.7).reshape(2, 2, 2))

    def forward(self, x):
        return self.lin(x) + (self.cube.sum(0) @ x[:, :2].T).T


def train_tiny(optimizer_kwargs, steps=5, schedule=False):
    model = Tiny()
    optimizer = Adafactor(model.parameters(), **optimizer_kwargs)
    scheduler = AdafactorSchedule(optimizer) if schedule else None
    losses, lrs = [], []
    for step in range(steps):
        x = torch.sin(torch.arange(12.0).reshape(4, 3) * (0.5 + 0.1 * step))
        y = torch.cos(torch.arange(8.0).reshape(4, 2) * (0.3 + 0.05 * step))
        loss = ((model(x) - y) ** 2).mean()
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
            lrs.append(scheduler.get_last_lr()[0])
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return model, optimizer, flat, losses, lrs


# Parameters (cube, lin.weight, lin.bias flattened) after 5 steps of transformers 5.23's Adafactor.
ADAFACTOR_REFERENCE = [
    ({"lr": 0.01, "scale_parameter": False, "relative_step": False},
     [0.979645252, 0.705992639, 0.212301165, -0.466761857, -0.962577105, -0.995306253, -0.447926998, 0.224596679,
      -0.0170535706, 0.917042732, 0.44458586, -0.644663453, -0.844790637, 0.239994586, 0.0911717266, -0.157573804],
     1.1394850015640259),
    ({},
     [0.98529464, 0.723569036, 0.199672103, -0.478081077, -0.956927717, -0.977729857, -0.46055603, 0.213277429,
      -0.0113160713, 0.933645427, 0.470244974, -0.660118997, -0.858592808, 0.231283739, 0.0987207368, -0.193160534],
     1.1967723369598389),
    ({"beta1": 0.9, "weight_decay": 0.1, "warmup_init": True},
     [0.999997973, 0.764838696, 0.169968888, -0.504843771, -0.942222357, -0.936458468, -0.490258574, 0.18651399,
      -7.61960848e-07, 0.963555276, 0.515497923, -0.687763631, -0.883452237, 0.215120807, 0.099999845, -0.199999526],
     1.3061455488204956),
]  # fmt: skip


@pytest.mark.parametrize("kwargs, expected, last_loss", ADAFACTOR_REFERENCE)
def test_adafactor_matches_reference(kwargs, expected, last_loss):
    _, _, flat, losses, _ = train_tiny(kwargs)
    assert flat.tolist() == pytest.approx(expected, abs=1e-6)
    assert losses[-1] == pytest.approx(last_loss, abs=1e-6)


def test_adafactor_reduces_a_loss():
    _, _, _, losses, _ = train_tiny({"lr": 0.05, "scale_parameter": False, "relative_step": False}, steps=30)
    assert losses[-1] < 0.5 * losses[0]


def test_adafactor_schedule_reports_the_relative_step_size():
    _, optimizer, _, _, lrs = train_tiny({}, schedule=True)
    # transformers 5.23's AdafactorSchedule on the same run
    assert lrs == pytest.approx([0.006989831104874611, 0.006983887869864702, 0.006979415658861399,
                                 0.006977571174502373, 0.006975632160902023], rel=1e-6)  # fmt: skip
    assert AdafactorSchedule(Adafactor(Tiny().parameters()), initial_lr=0.5).get_last_lr() == [0.5]


def test_adafactor_schedule_leaves_an_external_lr_alone():
    model = Tiny()
    optimizer = Adafactor(model.parameters(), lr=0.01, relative_step=False)
    scheduler = AdafactorSchedule(optimizer)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    assert scheduler.get_last_lr() == [0.01]
    assert optimizer.param_groups[0]["lr"] == 0.01 and "initial_lr" not in optimizer.param_groups[0]


def test_adafactor_argument_checks():
    params = list(Tiny().parameters())
    with pytest.raises(ValueError, match="manual lr with relative_step=True"):
        Adafactor(params, lr=0.1)
    with pytest.raises(ValueError, match="warmup_init=True requires relative_step=True"):
        Adafactor(params, lr=0.1, relative_step=False, warmup_init=True)
    with pytest.raises(ValueError, match="relative_step=False needs an explicit lr"):
        Adafactor(params, relative_step=False)


def test_adafactor_rejects_sparse_gradients():
    emb = nn.Embedding(4, 2, sparse=True)
    optimizer = Adafactor(emb.parameters())
    emb(torch.tensor([1])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        optimizer.step()


def test_adafactor_state_round_trips_and_resumes_identically():
    kwargs = {"beta1": 0.9, "weight_decay": 0.1}
    model, optimizer, _, _, _ = train_tiny(kwargs, steps=2)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    twin = Tiny()
    twin.load_state_dict(saved["model"])
    twin_opt = Adafactor(twin.parameters(), **kwargs)
    twin_opt.load_state_dict(saved["optim"])
    for m, opt in ((model, optimizer), (twin, twin_opt)):
        opt.zero_grad()  # train_tiny leaves the last gradients in place
        m(torch.ones(2, 3)).sum().backward()
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))


def test_adafactor_updates_bfloat16_parameters():
    model = Tiny().to(torch.bfloat16)
    optimizer = Adafactor(model.parameters(), lr=0.1, relative_step=False, scale_parameter=False)
    before = model.lin.weight.detach().clone()
    model(torch.ones(2, 3, dtype=torch.bfloat16)).float().sum().backward()
    optimizer.step()
    assert model.lin.weight.dtype == torch.bfloat16 and not torch.equal(model.lin.weight, before)
