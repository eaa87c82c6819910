"""Plain result containers and the string enums that arguments are coerced to.

Owns: ``EvalPrediction``, ``TrainOutput``, ``PredictionOutput``, ``EvalLoopOutput``, the strategy and
name enums (``IntervalStrategy``, ``SaveStrategy``, ``HubStrategy``, ``SchedulerType``, ``OptimizerNames``,
``ParallelMode``), :func:`enum_value` and ``PREFIX_CHECKPOINT_DIR``. Nothing here imports torch: these are
imported by the argument parser, which must stay cheap.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

PREFIX_CHECKPOINT_DIR = "checkpoint"


class ExplicitEnum(str, enum.Enum):
    """A ``str`` enum whose bad values raise an error listing the valid ones."""

    @classmethod
    def _missing_(cls, value: object) -> Any:
        valid = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"{value!r} is not a valid {cls.__name__}: choose one of {valid}")

    def __str__(self) -> str:  # so f"{strategy}" prints "steps", not "IntervalStrategy.STEPS"
        return str(self.value)


def enum_value(value: Any) -> Any:
    """``value.value`` for an enum member, else ``value`` as it is: for what a caller may hand a function as an
    enum of its own or of another library (``transformers``' enums are not always ``str`` enums, and print as
    ``Class.MEMBER``). The enum fields of ``TrainingArguments`` need none of this: normalization makes them
    ``ExplicitEnum`` members, which equal their string and ``str()`` to it."""
    return value.value if isinstance(value, enum.Enum) else value


class IntervalStrategy(ExplicitEnum):
    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


class SaveStrategy(ExplicitEnum):
    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"
    BEST = "best"


class HubStrategy(ExplicitEnum):
    END = "end"
    EVERY_SAVE = "every_save"
    CHECKPOINT = "checkpoint"
    ALL_CHECKPOINTS = "all_checkpoints"


class SchedulerType(ExplicitEnum):
    LINEAR = "linear"
    COSINE = "cosine"
    COSINE_WITH_RESTARTS = "cosine_with_restarts"
    POLYNOMIAL = "polynomial"
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    INVERSE_SQRT = "inverse_sqrt"
    REDUCE_ON_PLATEAU = "reduce_lr_on_plateau"
    COSINE_WITH_MIN_LR = "cosine_with_min_lr"
    COSINE_WARMUP_WITH_MIN_LR = "cosine_warmup_with_min_lr"
    WARMUP_STABLE_DECAY = "warmup_stable_decay"
    GREEDY = "greedy"


class OptimizerNames(ExplicitEnum):
    """Every ``optim`` name of the reference (5.x). Which ones run is decided by ``trainwell.optim``."""

    ADAMW_TORCH = "adamw_torch"
    ADAMW_TORCH_FUSED = "adamw_torch_fused"
    ADAMW_TORCH_XLA = "adamw_torch_xla"
    ADAMW_TORCH_NPU_FUSED = "adamw_torch_npu_fused"
    ADAFACTOR = "adafactor"
    ADAMW_ANYPRECISION = "adamw_anyprecision"
    ADAMW_TORCH_4BIT = "adamw_torch_4bit"
    ADAMW_TORCH_8BIT = "adamw_torch_8bit"
    ADEMAMIX = "ademamix"
    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAMW_BNB = "adamw_bnb_8bit"
    ADAMW_8BIT = "adamw_8bit"
    ADEMAMIX_8BIT = "ademamix_8bit"
    LION_8BIT = "lion_8bit"
    LION = "lion_32bit"
    PAGED_ADAMW = "paged_adamw_32bit"
    PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    PAGED_ADEMAMIX = "paged_ademamix_32bit"
    PAGED_ADEMAMIX_8BIT = "paged_ademamix_8bit"
    PAGED_LION = "paged_lion_32bit"
    PAGED_LION_8BIT = "paged_lion_8bit"
    RMSPROP = "rmsprop"
    RMSPROP_BNB = "rmsprop_bnb"
    RMSPROP_8BIT = "rmsprop_bnb_8bit"
    RMSPROP_32BIT = "rmsprop_bnb_32bit"
    GALORE_ADAMW = "galore_adamw"
    GALORE_ADAMW_8BIT = "galore_adamw_8bit"
    GALORE_ADAFACTOR = "galore_adafactor"
    GALORE_ADAMW_LAYERWISE = "galore_adamw_layerwise"
    GALORE_ADAMW_8BIT_LAYERWISE = "galore_adamw_8bit_layerwise"
    GALORE_ADAFACTOR_LAYERWISE = "galore_adafactor_layerwise"
    LOMO = "lomo"
    ADALOMO = "adalomo"
    GROKADAMW = "grokadamw"
    SCHEDULE_FREE_RADAM = "schedule_free_radam"
    SCHEDULE_FREE_ADAMW = "schedule_free_adamw"
    SCHEDULE_FREE_SGD = "schedule_free_sgd"
    APOLLO_ADAMW = "apollo_adamw"
    APOLLO_ADAMW_LAYERWISE = "apollo_adamw_layerwise"
    STABLE_ADAMW = "stable_adamw"


class ParallelMode(ExplicitEnum):
    NOT_PARALLEL = "not_parallel"
    NOT_DISTRIBUTED = "not_distributed"
    DISTRIBUTED = "distributed"
    SAGEMAKER_MODEL_PARALLEL = "sagemaker_model_parallel"
    SAGEMAKER_DATA_PARALLEL = "sagemaker_data_parallel"
    TPU = "tpu"


class EvalPrediction:
    """What ``compute_metrics`` receives: predictions and label ids (numpy arrays or nested tuples of them),
    plus ``inputs`` and ``losses`` when ``include_for_metrics`` asks for them.

    Iterating or indexing walks ``(predictions, label_ids[, inputs][, losses])`` so that
    ``preds, labels = eval_pred`` works as with the reference.
    """

    def __init__(self, predictions: Any, label_ids: Any, inputs: Any = None, losses: Any = None) -> None:
        self.predictions = predictions
        self.label_ids = label_ids
        self.inputs = inputs
        self.losses = losses
        self.elements: tuple[Any, ...] = (predictions, label_ids)
        if inputs is not None:
            self.elements += (inputs,)
        if losses is not None:
            self.elements += (losses,)

    def __iter__(self):
        return iter(self.elements)

    def __getitem__(self, idx: int) -> Any:
        if idx < 0 or idx >= len(self.elements):
            raise IndexError(f"EvalPrediction index {idx} out of range (it holds {len(self.elements)} elements)")
        return self.elements[idx]

    def __len__(self) -> int:
        return len(self.elements)


class TrainOutput(NamedTuple):
    global_step: int
    training_loss: float
    metrics: dict[str, float]


class PredictionOutput(NamedTuple):
    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None


class EvalLoopOutput(NamedTuple):
    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None
    num_samples: int | None


class BestRun(NamedTuple):
    """The best trial of ``Trainer.hyperparameter_search``: its id, objective value(s), hyperparameters and (Ray
    Tune) run summary."""

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any | None = None
