"""trainwell: a drop-in, independent implementation of the Hugging Face ``Trainer`` API.

Only public names are re-exported here, and lazily: ``from trainwell import TrainingArguments`` does not
pay for torch or accelerate until something needs them. Each name maps to the module that owns it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainwell.utils.lazy import lazy_exports
from trainwell.utils.version import __version__

_EXPORTS: dict[str, str] = {
    # the facade
    "Trainer": "trainwell.trainer",
    "Seq2SeqTrainer": "trainwell.trainer_seq2seq",
    # arguments
    "TrainingArguments": "trainwell.training_args",
    # trainwell underneath TRL and the other libraries that subclass the Trainer
    "patch_transformers": "trainwell.integrations.underneath",
    "Seq2SeqTrainingArguments": "trainwell.training_args_seq2seq",
    "AcceleratorConfig": "trainwell.training_args",
    "TrainwellArgumentParser": "trainwell.args.parser",
    "HfArgumentParser": "trainwell.args.parser",
    # results and enums
    "EvalPrediction": "trainwell.outputs",
    "TrainOutput": "trainwell.outputs",
    "PredictionOutput": "trainwell.outputs",
    "EvalLoopOutput": "trainwell.outputs",
    "IntervalStrategy": "trainwell.outputs",
    "SaveStrategy": "trainwell.outputs",
    "HubStrategy": "trainwell.outputs",
    "SchedulerType": "trainwell.outputs",
    "OptimizerNames": "trainwell.outputs",
    "PREFIX_CHECKPOINT_DIR": "trainwell.outputs",
    # state and callbacks
    "TrainerState": "trainwell.state",
    "TrainerControl": "trainwell.state",
    "ExportableState": "trainwell.state",
    "TrainerCallback": "trainwell.events.callback",
    "CallbackHandler": "trainwell.events.handler",
    "DefaultFlowCallback": "trainwell.events.flow",
    "ProgressCallback": "trainwell.events.progress",
    "PrinterCallback": "trainwell.events.progress",
    "EarlyStoppingCallback": "trainwell.events.early_stopping",
    # optimization
    "get_scheduler": "trainwell.optim.schedulers",
    "get_linear_schedule_with_warmup": "trainwell.optim.schedulers",
    "get_cosine_schedule_with_warmup": "trainwell.optim.schedulers",
    "get_cosine_with_hard_restarts_schedule_with_warmup": "trainwell.optim.schedulers",
    "get_polynomial_decay_schedule_with_warmup": "trainwell.optim.schedulers",
    "get_constant_schedule": "trainwell.optim.schedulers",
    "get_constant_schedule_with_warmup": "trainwell.optim.schedulers",
    "get_inverse_sqrt_schedule": "trainwell.optim.schedulers",
    "get_wsd_schedule": "trainwell.optim.schedulers",
    "Adafactor": "trainwell.optim.adafactor",
    "AdafactorSchedule": "trainwell.optim.adafactor",
    "GreedyLR": "trainwell.optim.greedy",
    # data
    "default_data_collator": "trainwell.data.collators",
    "DefaultDataCollator": "trainwell.data.collators",
    "DataCollatorWithPadding": "trainwell.data.collators",
    "DataCollatorForLanguageModeling": "trainwell.data.collators",
    "DataCollatorForSeq2Seq": "trainwell.data.collators",
    "DataCollatorForTokenClassification": "trainwell.data.collators",
    "DataCollatorForMultipleChoice": "trainwell.data.collators",
    "DataCollatorForPermutationLanguageModeling": "trainwell.data.collators",
    "DataCollatorWithFlattening": "trainwell.data.collators",
    # utilities
    "set_seed": "trainwell.utils.seed",
    "enable_full_determinism": "trainwell.utils.seed",
    "get_last_checkpoint": "trainwell.checkpoint.resume",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, extra_dir=["__version__"])


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from trainwell.outputs import EvalPrediction, PredictionOutput, TrainOutput  # noqa: F401
    from trainwell.trainer import Trainer  # noqa: F401
    from trainwell.training_args import TrainingArguments  # noqa: F401
