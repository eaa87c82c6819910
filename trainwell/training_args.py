"""``TrainingArguments``: every knob of a training run, with the names, types and defaults of transformers 5.23.

Owns: the 114 fields (grouped by concern, each with its ``--help`` text) and the
read-only views a run derives from them (batch sizes, device, process topology, log level, serialization).
Normalization and the 4.x aliases live in :mod:`trainwell.args.normalize`, cross-field checks in
:mod:`trainwell.args.validate`, the command-line parser in :mod:`trainwell.args.parser`.

Importing this module must stay cheap: no torch, no accelerate. Constructing the arguments creates no global
state (the reference builds or resets accelerate's ``PartialState`` here); the Trainer's runtime does that.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from trainwell.args import aliases, normalize, storage, support, validate
from trainwell.args.accelerator_config import AcceleratorConfig
from trainwell.args.fields import check_known_keys
from trainwell.outputs import (
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    ParallelMode,
    SaveStrategy,
    SchedulerType,
)
from trainwell.utils import logging as library_logging
from trainwell.utils.errors import choice_error

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from typing_extensions import Self

logger = logging.getLogger(__name__)

# Log level names accepted by log_level / log_level_replica; "passive" keeps whatever the application set.
LOG_LEVELS: dict[str, int] = {"detail": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
                               "warning": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL,
                               "passive": -1}


#: trainwell's own fields (after the reference's); ``to_dict`` writes them only when set
TRAINWELL_ONLY = frozenset({"save_async", "verify_checkpoint_checksums", "log_throughput", "skip_nonfinite_steps",
                            "rollback_on_spike", "step_timeout", "output_staging_dir", "storage_options"})


def _arg(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None, **meta: Any) -> Any:
    meta["help"] = help
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _initialized_dist() -> Any:
    # torch.distributed can only be initialized if something imported it, so a missing module means "no":
    # checking sys.modules keeps these properties from importing torch on a plain CPU run.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


@dataclass
class TrainingArguments(metaclass=aliases.AliasInitMeta):
    """All the settings of a training run; pass it to ``Trainer(args=...)``.

    Same fields, types and defaults as ``transformers.TrainingArguments`` 5.23. ``__post_init__`` normalizes
    (JSON strings, enums, derived defaults), validates (errors name the argument, its value and the fix) and
    rejects fields trainwell does not act on yet. The popular 4.x names (``evaluation_strategy``,
    ``warmup_ratio``, ``no_cuda``, ...) are accepted with a FutureWarning; see ``trainwell.args.normalize``.
    """

    # Not fields: the optimizer name a bare TrainingArguments picks, and where 4.x `logging_dir=` lands.
    default_optim = "adamw_torch_fused"
    logging_dir = None
    # The dict fields a JSON object string is parsed for; subclasses (TRL's configs) extend the list, as with the
    # reference.
    _VALID_DICT_FIELDS = list(normalize.DICT_FIELDS)

    # --- output ---
    output_dir: str | None = _arg(None, "Where checkpoints and the final model are written "
                                  "(default: 'trainer_output'; '~' is expanded).")

    # --- duration and batch size ---
    per_device_train_batch_size: int = _arg(8, "Training batch size on each device (the micro-batch).")
    num_train_epochs: float = _arg(3.0, "Epochs to train; a fraction trains part of the last epoch.")
    max_steps: int = _arg(-1, "Total optimizer steps; when > 0 it overrides num_train_epochs. Required for "
                          "datasets without a length.")

    # --- learning rate and schedule ---
    learning_rate: float = _arg(5e-5, "Peak learning rate of the optimizer.")
    lr_scheduler_type: SchedulerType | str = _arg("linear", "Learning-rate schedule: one of the SchedulerType "
                                                  "names, e.g. linear, cosine, constant_with_warmup.")
    lr_scheduler_kwargs: dict | str | None = _arg(None, "Extra keyword arguments for the schedule, as a dict or a "
                                                  "JSON object string.")
    warmup_steps: float = _arg(0, "Linear warmup length: a whole number of steps, or a ratio of the total steps "
                               "when below 1.")

    # --- optimizer ---
    optim: OptimizerNames | str = _arg(default_optim, "Optimizer name (see OptimizerNames).")
    optim_args: str | None = _arg(None, "Extra optimizer options as 'key=value,key2=value2'.")
    weight_decay: float = _arg(0.0, "Weight decay, applied to every parameter except biases and norm weights.")
    adam_beta1: float = _arg(0.9, "Beta1 (first-moment decay) of Adam-style optimizers.")
    adam_beta2: float = _arg(0.999, "Beta2 (second-moment decay) of Adam-style optimizers.")
    adam_epsilon: float = _arg(1e-8, "Epsilon of Adam-style optimizers.")
    optim_target_modules: None | str | list[str] = _arg(None, "Modules a low-rank optimizer (GaLore, APOLLO) "
                                                        "targets: names, a regex or 'all-linear'.")

    # --- gradients and regularization ---
    gradient_accumulation_steps: int = _arg(1, "Micro-batches whose gradients add up to one optimizer step.")
    average_tokens_across_devices: bool = _arg(True, "Sum the loss-token count over all processes so that the "
                                               "loss is normalized by the global number of tokens.")
    max_grad_norm: float = _arg(1.0, "Clip the global gradient norm to this value; 0 or less disables clipping.")
    label_smoothing_factor: float = _arg(0.0, "Label smoothing epsilon; 0 disables it.")

    # --- precision ---
    bf16: bool = _arg(False, "Train with bfloat16 mixed precision (autocast; works on CPU too).")
    fp16: bool = _arg(False, "Train with float16 mixed precision and a gradient scaler.")
    bf16_full_eval: bool = _arg(False, "Cast the model to bfloat16 for evaluation (not just autocast).")
    fp16_full_eval: bool = _arg(False, "Cast the model to float16 for evaluation (not just autocast).")
    tf32: bool | None = _arg(None, "Allow (True) or forbid (False) TF32 matmuls on Ampere+ GPUs; None leaves "
                             "the torch setting alone.")

    # --- activation checkpointing ---
    activation_checkpointing: bool | None = _arg(None, "Recompute activations in the backward pass to save "
                                                 "memory at the cost of speed.", nargs="?", const=True)
    activation_checkpointing_kwargs: dict[str, Any] | str | None = _arg(
        None, "Options for activation checkpointing (every_n_layers, offload, or torch.utils.checkpoint "
        "arguments), as a dict or JSON object string.")
    gradient_checkpointing: bool | None = _arg(None, "Old name of activation_checkpointing.", nargs="?", const=True)
    gradient_checkpointing_kwargs: dict[str, Any] | str | None = _arg(
        None, "Old name of activation_checkpointing_kwargs.")

    # --- compilation and kernels ---
    torch_compile: bool = _arg(False, "Compile the model with torch.compile.")
    torch_compile_backend: str | None = _arg(None, "torch.compile backend; setting it turns torch_compile on.")
    torch_compile_mode: str | None = _arg(None, "torch.compile mode; setting it turns torch_compile on.")
    use_liger_kernel: bool = _arg(False, "Patch the model with Liger kernels.")
    liger_kernel_config: dict[str, bool] | None = _arg(None, "Options for the Liger kernel patching.")

    # --- other training options ---
    use_cache: bool = _arg(False, "Value written to model.config.use_cache (key/value caching during training).")
    neftune_noise_alpha: float | None = _arg(None, "Add NEFTune noise of this scale to the input embeddings "
                                             "while training.")
    torch_empty_cache_steps: int | None = _arg(None, "Empty the device memory cache every this many steps.")
    auto_find_batch_size: bool = _arg(False, "On out-of-memory, retry training with a smaller batch size.")

    # --- logging ---
    logging_strategy: IntervalStrategy | str = _arg("steps", "When to log training metrics: no, steps or epoch.")
    logging_steps: float = _arg(500, "Log every this many steps (a ratio of the total steps when below 1).")
    logging_first_step: bool = _arg(False, "Also log after the first optimizer step.")
    log_on_each_node: bool = _arg(True, "In multi-node runs, log from the main process of every node, not only "
                                  "the global main process.")
    logging_nan_inf_filter: bool = _arg(True, "Leave NaN/inf losses out of the logged running average.")
    include_num_input_tokens_seen: str | bool = _arg("no", "Count input tokens: 'all', 'non_padding' or 'no' "
                                                     "(True means 'all').")
    log_level: str = _arg("passive", "Log level of the main process ('passive' keeps the current one).",
                          choices=tuple(LOG_LEVELS))
    log_level_replica: str = _arg("warning", "Log level of the other processes.", choices=tuple(LOG_LEVELS))
    disable_tqdm: bool | None = _arg(None, "Hide progress bars (default: hidden when logging is quieter than "
                                     "WARNING).")

    # --- experiment tracking ---
    report_to: None | str | list[str] = _arg("none", "Trackers to send logs to: names, 'all' (every installed "
                                             "one) or 'none'.")
    run_name: str | None = _arg(None, "Run name shown by the trackers.")
    project: str = _arg("huggingface", "Project name for Trackio.")
    trackio_space_id: str | None = _arg(None, "Hugging Face Space that hosts a live Trackio dashboard.")
    trackio_bucket_id: str | None = _arg(None, "Hugging Face bucket for Trackio data.")
    trackio_static_space_id: str | None | Literal[False] = _arg(None, "Static Trackio Space synced from the "
                                                                 "bucket; False disables it.")

    # --- evaluation ---
    eval_strategy: IntervalStrategy | str = _arg("no", "When to evaluate: no, steps or epoch.")
    eval_steps: float | None = _arg(None, "Evaluate every this many steps (default: logging_steps; a ratio of "
                                    "the total steps when below 1).")
    eval_delay: float = _arg(0, "Steps or epochs (per eval_strategy) to wait before the first evaluation.")
    per_device_eval_batch_size: int = _arg(8, "Evaluation batch size on each device.")
    prediction_loss_only: bool = _arg(False, "Return only the loss from evaluate()/predict().")
    eval_on_start: bool = _arg(False, "Evaluate once before the first training step (a quick sanity check).")
    eval_do_concat_batches: bool = _arg(True, "Concatenate predictions across batches (False keeps a list of "
                                        "per-batch outputs).")
    eval_use_gather_object: bool = _arg(False, "Gather Python objects (not only tensors) from all processes.")
    eval_accumulation_steps: int | None = _arg(None, "Move predictions off the device every this many "
                                               "evaluation steps.")
    include_for_metrics: list[str] = _arg(help="Also pass 'inputs' and/or 'loss' to compute_metrics.",
                                          factory=list)
    batch_eval_metrics: bool = _arg(False, "Call compute_metrics on every batch (with compute_result on the "
                                    "last) instead of once on everything.")

    # --- checkpoints ---
    save_only_model: bool = _arg(False, "Save only the weights (no optimizer, scheduler or RNG state: such a "
                                 "checkpoint cannot resume training).")
    save_strategy: SaveStrategy | str = _arg("steps", "When to save a checkpoint: no, steps, epoch or best.")
    save_steps: float = _arg(500, "Save every this many steps (a ratio of the total steps when below 1).")
    save_on_each_node: bool = _arg(False, "In multi-node runs, save on every node (for disks that are not "
                                   "shared).")
    save_total_limit: int | None = _arg(None, "Keep at most this many checkpoints (the best one is kept too).")
    enable_jit_checkpoint: bool = _arg(False, "On SIGTERM, save a checkpoint before exiting (preemptible jobs).")

    # --- Hugging Face Hub ---
    push_to_hub: bool = _arg(False, "Upload the model to the Hub on each save.")
    hub_token: str | None = _arg(None, "Token for Hub uploads.")
    hub_private_repo: bool | None = _arg(None, "Create the Hub repository as private.")
    hub_model_id: str | None = _arg(None, "Hub repository to upload to, as 'name' or 'organization/name'.")
    hub_strategy: HubStrategy | str = _arg("every_save", "What to upload and when: end, every_save, checkpoint "
                                           "or all_checkpoints.")
    hub_always_push: bool = _arg(False, "Upload even when the previous upload has not finished.")
    hub_revision: str | None = _arg(None, "Branch, tag or commit to upload to.")

    # --- best model ---
    load_best_model_at_end: bool = _arg(False, "Reload the best checkpoint when training ends.")
    metric_for_best_model: str | None = _arg(None, "Metric that ranks checkpoints (default 'loss' when needed; "
                                             "the 'eval_' prefix is optional).")
    greater_is_better: bool | None = _arg(None, "Whether a larger metric is better (default: False for names "
                                          "ending in 'loss', True otherwise).")

    # --- resuming ---
    ignore_data_skip: bool = _arg(False, "When resuming, restart the data from the beginning of the epoch "
                                  "instead of skipping the batches already seen.")
    restore_callback_states_from_checkpoint: bool = _arg(False, "When resuming, restore the state of stateful "
                                                         "callbacks saved in the checkpoint.")

    # --- reproducibility ---
    full_determinism: bool = _arg(False, "Use deterministic algorithms everywhere (slow; for debugging).")
    seed: int = _arg(42, "Seed set at the start of training.")
    data_seed: int | None = _arg(None, "Seed of the data samplers (default: seed).")

    # --- hardware and accelerate ---
    use_cpu: bool = _arg(False, "Train on the CPU even when an accelerator is available.")
    accelerator_config: dict | str | None = _arg(None, "AcceleratorConfig options as a dict, a JSON object string "
                                                 "or a JSON file path.")
    # Typed Any rather than accelerate's ParallelismConfig: naming that type would import accelerate.
    parallelism_config: Any | None = _arg(None, "accelerate.ParallelismConfig (or a dict of its sizes): the "
                                             "device mesh for data, sharded-data and tensor parallelism.")

    # --- data loading ---
    dataloader_drop_last: bool = _arg(False, "Drop the last incomplete batch.")
    dataloader_num_workers: int = _arg(0, "Worker processes for data loading (0 loads in the main process).")
    dataloader_pin_memory: bool = _arg(True, "Pin host memory of batches for faster copies to the device.")
    dataloader_persistent_workers: bool = _arg(False, "Keep worker processes alive between epochs.")
    dataloader_prefetch_factor: int | None = _arg(None, "Batches each worker loads ahead.")
    dataloader_multiprocessing_context: str | None = _arg(None, "Start method of the workers.",
                                                          choices=("fork", "spawn", "forkserver"))
    dataloader_in_order: bool = _arg(True, "Yield batches in order (False: as soon as any worker is ready).")
    remove_unused_columns: bool = _arg(True, "Drop input keys the model's forward does not accept.")
    label_names: list[str] | None = _arg(None, "Input keys that hold labels (default: forward arguments whose "
                                         "name contains 'label').")
    train_sampling_strategy: str = _arg("random", "Training sample order.",
                                        choices=("random", "sequential", "group_by_length", "batch_rebalance"))
    length_column_name: str = _arg("length", "Column with precomputed lengths, for the length-based samplers.")

    # --- DistributedDataParallel ---
    ddp_find_unused_parameters: bool | None = _arg(None, "DDP find_unused_parameters.")
    ddp_bucket_cap_mb: int | None = _arg(None, "DDP bucket_cap_mb.")
    ddp_broadcast_buffers: bool | None = _arg(None, "DDP broadcast_buffers.")
    ddp_static_graph: bool | None = _arg(None, "DDP static_graph.")
    ddp_backend: str | None = _arg(None, "torch.distributed backend.",
                                   choices=("nccl", "gloo", "mpi", "xccl", "hccl", "cncl", "mccl"))
    ddp_timeout: int = _arg(1800, "Timeout of distributed operations, in seconds.")

    # --- FSDP and DeepSpeed ---
    fsdp: str | None = _arg(None, "Shard the model with FSDP.", nargs="?", const=True)
    fsdp_config: dict[str, Any] | str | None = _arg(None, "FSDP options as a dict, JSON string or JSON file path.")
    deepspeed: dict | str | None = _arg(None, "DeepSpeed config as a dict, JSON string or JSON file path.")

    # --- debugging ---
    # The reference types the list as list[DebugOption]; trainwell keeps the option names as plain strings.
    debug: str | list[str] = _arg("", "Debug features, space separated: underflow_overflow, tpu_metrics_debug.")
    skip_memory_metrics: bool = _arg(True, "Skip the memory profiling metrics (they slow training down).")

    # --- flags for scripts (the Trainer itself does not read them) ---
    do_train: bool = _arg(False, "Script flag: run training.")
    do_eval: bool = _arg(False, "Script flag: run evaluation (set automatically when eval_strategy is not 'no').")
    do_predict: bool = _arg(False, "Script flag: run prediction.")
    resume_from_checkpoint: str | None = _arg(None, "Script flag: checkpoint folder to resume from.")
    local_rank: int = _arg(-1, "Set by old launchers; read local_process_index instead.")

    # --- trainwell's own (after the reference's fields; not in transformers) ---
    save_async: bool = _arg(False, "trainwell: write checkpoints in the background; training waits only for a "
                            "host copy of the weights and optimizer state (see docs/checkpoints.md).")
    verify_checkpoint_checksums: bool = _arg(True, "trainwell: on resume, compare every checkpoint file with the "
                                             "checksum its manifest recorded (reads each file once); False "
                                             "compares only their sizes (very large sharded checkpoints), and "
                                             "resumes a trainwell checkpoint that lost its manifest, unchecked.")
    log_throughput: bool = _arg(False, "trainwell: add tokens_per_second (over each log window, all processes) "
                                "and, on a GPU of known peak in bf16/fp16, mfu (6 x non-embedding parameters x "
                                "tokens/s over the peak) to each training log and the progress bar.")
    skip_nonfinite_steps: bool | None = _arg(
        None, "trainwell: do not apply an optimizer step whose loss or gradient norm is NaN/inf (decided on the "
        "device, no sync; the count is logged as skipped_nonfinite_steps). None (default): wherever the optimizer "
        "skips a step itself (torch's fused optimizers, the default adamw_torch_fused; fp16's grad scaler); True: with "
        "any optimizer (a copy of the parameters and optimizer state guards the others); False: never. A checkpoint "
        "of non-finite weights is refused whatever the setting (docs/resilience.md).", nargs="?", const=True)
    rollback_on_spike: float | None = _arg(
        None, "trainwell: when a logged loss exceeds this factor times the median of the recent logged losses (or is "
        "NaN/inf), reload the last good checkpoint, skip the data since it and go on (at most 3 times); e.g. 5.0. "
        "Needs checkpoints (docs/resilience.md).")
    step_timeout: float | str | None = _arg(
        None, "trainwell: seconds without progress (a micro-batch, an evaluation batch, a save) after which every "
        "process prints its Python stack and the run stops, naming the stuck process; 'auto' derives it from the "
        "median step time (docs/resilience.md).")
    output_staging_dir: str | None = _arg(
        None, "trainwell: with an object-store output_dir (s3://, gs://, az://, file://), the local folder each "
        "checkpoint is written into before it is uploaded, and where logs and the live log stay (default: "
        "trainwell_staging/{scheme}/{bucket}/{path} in the working directory; docs/checkpoints.md).")
    storage_options: dict | str | None = _arg(
        None, "trainwell: fsspec's options for a URL output_dir's store (a dict or JSON); never printed.")

    def __post_init__(self) -> None:
        normalize.normalize_args(self, AcceleratorConfig)
        validate.validate_args(self)
        # An attribute the reference sets; trainwell builds plugins in its runtime, never here. (fsdp_plugin_args,
        # the reference's keyword arguments of the FSDP plugin, is set by normalization.)
        self.deepspeed_plugin = None
        support.check_supported(self, normalize.declared_defaults(TrainingArguments))

    # --- sizes and devices ---

    @property
    def train_batch_size(self) -> int:
        """Training batch size of one process: ``per_device_train_batch_size * max(1, n_gpu)``."""
        return self.per_device_train_batch_size * max(1, self.n_gpu)

    @property
    def eval_batch_size(self) -> int:
        """Evaluation batch size of one process: ``per_device_eval_batch_size * max(1, n_gpu)``."""
        return self.per_device_eval_batch_size * max(1, self.n_gpu)

    @property
    def n_gpu(self) -> int:
        """Accelerators this process drives: 0 on CPU, else 1 (trainwell never uses ``nn.DataParallel``)."""
        forced = self.__dict__.get("_n_gpu")  # scripts and tests written for the reference set this
        if forced is not None:
            return forced
        return 0 if self.device.type == "cpu" else 1

    @property
    def device(self) -> torch.device:
        """The device of this process: CPU when ``use_cpu`` or nothing else exists, else the local accelerator."""
        import torch  # deferred: reading the arguments must not cost a torch import

        if self.use_cpu:
            return torch.device("cpu")
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_process_index)
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            return torch.device("xpu", self.local_process_index)
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")

    @property
    def world_size(self) -> int:
        """Number of processes: from ``torch.distributed`` when initialized, else ``$WORLD_SIZE``, else 1."""
        dist = _initialized_dist()
        return dist.get_world_size() if dist is not None else _env_int("WORLD_SIZE", 1)

    @property
    def process_index(self) -> int:
        """Global rank: from ``torch.distributed`` when initialized, else ``$RANK``, else 0."""
        dist = _initialized_dist()
        return dist.get_rank() if dist is not None else _env_int("RANK", 0)

    @property
    def local_process_index(self) -> int:
        """Rank on this node: ``$LOCAL_RANK``, else the ``local_rank`` field when set, else 0."""
        return _env_int("LOCAL_RANK", self.local_rank if self.local_rank >= 0 else 0)

    @property
    def parallel_mode(self) -> ParallelMode:
        """``DISTRIBUTED`` with more than one process, else ``NOT_PARALLEL``."""
        return ParallelMode.DISTRIBUTED if self.world_size > 1 else ParallelMode.NOT_PARALLEL

    @property
    def should_log(self) -> bool:
        """Whether this process logs: local rank 0 with ``log_on_each_node``, else global rank 0."""
        return (self.local_process_index if self.log_on_each_node else self.process_index) == 0

    @property
    def should_save(self) -> bool:
        """Whether this process writes to disk: local rank 0 with ``save_on_each_node``, else global rank 0."""
        return (self.local_process_index if self.save_on_each_node else self.process_index) == 0

    @property
    def place_model_on_device(self) -> bool | None:
        """``None``: let the Trainer decide. Subclasses may override (as with the reference)."""
        return None

    @property
    def ddp_timeout_delta(self) -> timedelta:
        """``ddp_timeout`` as the ``timedelta`` that ``init_process_group`` expects."""
        return timedelta(seconds=self.ddp_timeout)

    @property
    def distributed_state(self) -> Any:
        """Accelerate's ``PartialState`` for these arguments (libraries read its ``distributed_type``).

        Created on first access, not at construction as in the reference: building arguments alone never sets
        up process-wide state (under ``torchrun`` this initializes the process group, as the Trainer would).
        """
        from trainwell.args.launcher import partial_state

        return partial_state(self)

    def get_process_log_level(self) -> int:
        """The ``logging`` level for this process: ``log_level`` if ``should_log``, else ``log_level_replica``.

        ``"passive"`` resolves to the library's verbosity (:func:`trainwell.utils.logging.passive_level`).
        """
        level = LOG_LEVELS[self.log_level if self.should_log else self.log_level_replica]
        return library_logging.passive_level() if level == -1 else level

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Iterator[None]:
        """Run the block on the main process (per node when ``local``) before the others.

        Replicas wait at a barrier until the main process has finished the block, e.g. so that a
        ``datasets.map`` cache is written once and then read by everyone. Without an initialized
        ``torch.distributed`` group this is a plain ``yield``.
        """
        dist = _initialized_dist()
        if dist is None or self.world_size <= 1:
            yield
            return
        is_main = (self.local_process_index if local else self.process_index) == 0
        if not is_main:
            logger.debug("rank %d waits for the main process to finish %s", self.process_index, desc)
            dist.barrier()
        try:
            yield
        finally:
            if is_main:
                logger.debug("rank %d finished %s; releasing the other processes", self.process_index, desc)
                dist.barrier()

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup length in steps: ``warmup_steps`` when >= 1, else ``ceil(num_training_steps * warmup_steps)``."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil(num_training_steps * self.warmup_steps)

    # --- serialization ---

    def to_dict(self) -> dict[str, Any]:
        """Fields as plain JSON-friendly values; enums become strings and ``*_token`` fields are masked.

        trainwell's own fields appear only when set, so a run that uses none gives exactly the reference's keys.
        """
        out = {
            f.name: normalize.to_plain(getattr(self, f.name))
            for f in fields(self)
            if f.init and not (f.name in TRAINWELL_ONLY and getattr(self, f.name) == f.default)
        }
        out.update({name: f"<{name.upper()}>" for name in out if name.endswith("_token")})
        return storage.hide_options(out)

    def to_json_string(self) -> str:
        """:meth:`to_dict` as indented JSON with sorted keys (anything exotic is written with ``str``)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` plus the effective batch sizes, with non-scalars as strings (for tracker hparams)."""
        data = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        return {k: v if type(v) in (bool, int, float, str) else str(v) for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Build from a mapping such as :meth:`to_dict` output; unknown keys raise ``ValueError``."""
        known = {f.name for f in fields(cls) if f.init} | set(aliases.ALIASES_BY_NAME)
        check_known_keys(data, known, cls.__name__)
        return cls(**data)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> Self:
        """Build from a JSON file holding one object (e.g. a saved :meth:`to_json_string`)."""
        return cls.from_dict(normalize.load_json_object(path, cls.__name__))

    def __str__(self) -> str:
        body = "".join(f"{k}={v},\n" for k, v in sorted(self.to_dict().items()))
        return f"{type(self).__name__}(\n{body})"

    __repr__ = __str__

    # --- fluent setters (same signatures as the reference; each returns self) ---

    def set_training(self, learning_rate: float = 5e-5, batch_size: int = 8, weight_decay: float = 0,
                     num_epochs: float = 3, max_steps: int = -1, gradient_accumulation_steps: int = 1,
                     seed: int = 42, activation_checkpointing: bool = False,
                     gradient_checkpointing: bool | None = None) -> Self:
        """Set the core training options and ``do_train=True``."""
        if gradient_checkpointing is not None:
            warnings.warn("gradient_checkpointing is deprecated, use activation_checkpointing instead.",
                          FutureWarning, stacklevel=2)
            activation_checkpointing = gradient_checkpointing
        self.do_train = True
        self.learning_rate, self.weight_decay, self.seed = learning_rate, weight_decay, seed
        self.per_device_train_batch_size, self.num_train_epochs, self.max_steps = batch_size, num_epochs, max_steps
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.activation_checkpointing = self.gradient_checkpointing = activation_checkpointing
        return validate.checked_values(self)

    def set_evaluate(self, strategy: str | IntervalStrategy = "no", steps: int = 500, batch_size: int = 8,
                     accumulation_steps: int | None = None, delay: float | None = None,
                     loss_only: bool = False) -> Self:
        """Set the evaluation options; ``do_eval`` follows the strategy."""
        self.eval_strategy = normalize.coerce_enum("eval_strategy", strategy, IntervalStrategy)
        validate.require_steps(self.eval_strategy, steps, "eval")
        self.do_eval = self.eval_strategy != IntervalStrategy.NO
        self.eval_steps, self.per_device_eval_batch_size = steps, batch_size
        self.eval_accumulation_steps, self.prediction_loss_only = accumulation_steps, loss_only
        self.eval_delay = 0 if delay is None else delay  # None would break the "step >= delay" comparison
        return validate.checked_values(self)

    def set_testing(self, batch_size: int = 8, loss_only: bool = False) -> Self:
        """Set the prediction options and ``do_predict=True``."""
        self.do_predict, self.per_device_eval_batch_size, self.prediction_loss_only = True, batch_size, loss_only
        return validate.checked_values(self)

    def set_save(self, strategy: str | IntervalStrategy = "steps", steps: int = 500,
                 total_limit: int | None = None, on_each_node: bool = False) -> Self:
        """Set the checkpointing options."""
        self.save_strategy = normalize.coerce_enum("save_strategy", strategy, SaveStrategy)
        validate.require_steps(self.save_strategy, steps, "save")
        self.save_steps, self.save_total_limit, self.save_on_each_node = steps, total_limit, on_each_node
        return validate.checked_values(self)

    def set_logging(self, strategy: str | IntervalStrategy = "steps", steps: int = 500,
                    report_to: str | list[str] = "none", level: str = "passive", first_step: bool = False,
                    nan_inf_filter: bool = False, on_each_node: bool = False,
                    replica_level: str = "passive") -> Self:
        """Set the logging options (``report_to`` is normalized like the field)."""
        self.logging_strategy = normalize.coerce_enum("logging_strategy", strategy, IntervalStrategy)
        validate.require_steps(self.logging_strategy, steps, "logging")
        for name, value in (("log_level", level), ("log_level_replica", replica_level)):
            if value not in LOG_LEVELS:
                raise choice_error(name, value, LOG_LEVELS)
        self.logging_steps, self.report_to = steps, normalize.normalize_report_to(report_to)
        self.log_level, self.log_level_replica = level, replica_level
        self.logging_first_step, self.logging_nan_inf_filter = first_step, nan_inf_filter
        self.log_on_each_node = on_each_node
        return validate.checked_values(self)

    def set_push_to_hub(self, model_id: str, strategy: str | HubStrategy = "every_save", token: str | None = None,
                        private_repo: bool | None = None, always_push: bool = False,
                        revision: str | None = None) -> Self:
        """Turn on ``push_to_hub`` with these Hub options (see docs/hub.md)."""
        self.push_to_hub, self.hub_model_id, self.hub_token = True, model_id, token
        self.hub_strategy = normalize.coerce_enum("hub_strategy", strategy, HubStrategy)
        self.hub_private_repo, self.hub_always_push, self.hub_revision = private_repo, always_push, revision
        return validate.checked_values(self)

    def set_optimizer(self, name: str | OptimizerNames = "adamw_torch", learning_rate: float = 5e-5,
                      weight_decay: float = 0, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                      args: str | None = None) -> Self:
        """Set the optimizer and its hyperparameters."""
        self.optim = normalize.coerce_enum("optim", name, OptimizerNames)
        self.learning_rate, self.weight_decay, self.optim_args = learning_rate, weight_decay, args
        self.adam_beta1, self.adam_beta2, self.adam_epsilon = beta1, beta2, epsilon
        return validate.checked_values(self)

    def set_lr_scheduler(self, name: str | SchedulerType = "linear", num_epochs: float = 3.0, max_steps: int = -1,
                         warmup_steps: float = 0) -> Self:
        """Set the schedule and the run length it spans."""
        self.lr_scheduler_type = normalize.coerce_enum("lr_scheduler_type", name, SchedulerType)
        self.num_train_epochs, self.max_steps, self.warmup_steps = num_epochs, max_steps, warmup_steps
        return validate.checked_values(self)

    def set_dataloader(self, train_batch_size: int = 8, eval_batch_size: int = 8, drop_last: bool = False,
                       num_workers: int = 0, pin_memory: bool = True, persistent_workers: bool = False,
                       prefetch_factor: int | None = None, multiprocessing_context: str | None = None,
                       in_order: bool = True, auto_find_batch_size: bool = False, ignore_data_skip: bool = False,
                       sampler_seed: int | None = None) -> Self:
        """Set the batch sizes and data-loader options (``sampler_seed`` sets ``data_seed``)."""
        self.per_device_train_batch_size, self.per_device_eval_batch_size = train_batch_size, eval_batch_size
        self.dataloader_drop_last, self.dataloader_num_workers = drop_last, num_workers
        self.dataloader_pin_memory, self.dataloader_persistent_workers = pin_memory, persistent_workers
        self.dataloader_prefetch_factor = prefetch_factor
        self.dataloader_multiprocessing_context = multiprocessing_context
        self.dataloader_in_order, self.auto_find_batch_size = in_order, auto_find_batch_size
        self.ignore_data_skip, self.data_seed = ignore_data_skip, sampler_seed
        return validate.checked_values(self)

