"""``Seq2SeqTrainer``: evaluation and prediction that generate, for summarization, translation and other
sequence-to-sequence or decoder-only generation tasks (the reference's ``transformers.trainer_seq2seq``).

With ``predict_with_generate=True`` each evaluation batch goes through the model's ``generate()`` (a
``transformers`` model, or any module with a compatible ``generate`` and ``generation_config``); the generated
ids, padded to the generation's ``max_length`` with the pad token, are the predictions ``compute_metrics``
receives, and the loss still comes from one forward pass with the labels. Batches of different lengths are then
padded with ``-100`` across the evaluation, as every prediction is. Generation settings come, by priority, from
the keyword arguments of ``evaluate``/``predict``, from ``generation_max_length``/``generation_num_beams``, and
from the model's ``generation_config``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainwell.outputs import PredictionOutput
from trainwell.trainer import Trainer
from trainwell.utils import model as model_utils


class Seq2SeqTrainer(Trainer):
    """A :class:`~trainwell.Trainer` whose evaluation can generate; takes :class:`Seq2SeqTrainingArguments`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gen_kwargs: dict[str, Any] = {}
        config = getattr(self.args, "generation_config", None)
        if config is not None:
            self.model.generation_config = self.load_generation_config(config)

    @staticmethod
    def load_generation_config(gen_config_arg: Any) -> Any:
        """A ``GenerationConfig`` as is, or loaded from a model id or folder (``transformers`` needed)."""
        if hasattr(gen_config_arg, "to_dict") and hasattr(gen_config_arg, "max_length"):
            return gen_config_arg
        try:
            from transformers import GenerationConfig
        except ImportError as err:
            raise ImportError(
                f"generation_config={gen_config_arg!r} names a configuration to load, which needs transformers: "
                "pip install transformers, or pass a GenerationConfig object."
            ) from err
        return GenerationConfig.from_pretrained(gen_config_arg)

    def _with_defaults(self, gen_kwargs: dict[str, Any]) -> dict[str, Any]:
        """The call's generation settings, completed from ``generation_max_length``/``generation_num_beams``."""
        gen_kwargs = dict(gen_kwargs)
        if gen_kwargs.get("max_length") is None and gen_kwargs.get("max_new_tokens") is None:
            if getattr(self.args, "generation_max_length", None) is not None:
                gen_kwargs["max_length"] = self.args.generation_max_length
        if gen_kwargs.get("num_beams") is None and getattr(self.args, "generation_num_beams", None) is not None:
            gen_kwargs["num_beams"] = self.args.generation_num_beams
        return gen_kwargs

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval", **gen_kwargs: Any) -> dict[str, float]:
        """``Trainer.evaluate``, generating with ``gen_kwargs`` (``max_length``, ``num_beams``, ...)."""
        self._gen_kwargs = self._with_defaults(gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test",
                **gen_kwargs: Any) -> PredictionOutput:
        """``Trainer.predict``, generating with ``gen_kwargs``."""
        self._gen_kwargs = self._with_defaults(gen_kwargs)
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None, **gen_kwargs: Any) -> tuple[Any, Any, Any]:
        """(loss, generated ids, labels) with ``predict_with_generate``; ``Trainer.prediction_step`` otherwise."""
        if not getattr(self.args, "predict_with_generate", False) or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        has_labels = "labels" in inputs
        inputs = self._prepare_inputs(inputs)
        generated = self._generate(inputs, gen_kwargs or dict(self._gen_kwargs))
        loss = None
        if has_labels:
            with torch.no_grad(), self.compute_loss_context_manager():
                outputs = model(**inputs)
            if self.label_smoother is not None:
                loss = self.label_smoother(outputs, inputs["labels"]).detach().mean()
            else:
                loss = (outputs["loss"] if isinstance(outputs, dict) else outputs[0]).detach().mean()
        if self.args.prediction_loss_only:
            return loss, None, None
        labels = self._pad_to_generation_length(inputs["labels"]) if has_labels else None
        return loss, generated, labels

    def _generate(self, inputs: dict[str, Any], gen_kwargs: dict[str, Any]) -> torch.Tensor:
        for key in ("num_beams", "max_length"):
            if key in gen_kwargs and gen_kwargs[key] is None:
                del gen_kwargs[key]
        # every process must take part in each generation step while parameters are sharded
        gen_kwargs.setdefault("synced_gpus", self.runtime.engine.syncs_forward)
        generation_inputs = dict(inputs)
        labels, decoder_ids = inputs.get("labels"), inputs.get("decoder_input_ids")
        if labels is not None and decoder_ids is not None and labels.shape == decoder_ids.shape:
            # decoder inputs made from the labels by the collator: generating must start from scratch
            generation_inputs.pop("decoder_input_ids")
            generation_inputs.pop("decoder_attention_mask", None)
        generator = model_utils.unwrap(self.model)
        with torch.no_grad():
            generated = generator.generate(**generation_inputs, **gen_kwargs)
        config = generator.generation_config
        if getattr(config, "_from_model_config", False):
            config._from_model_config = False  # or generate() rebuilds the config from the model at every batch
        return self._pad_to_generation_length(generated)

    def _pad_to_generation_length(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` padded with the pad token to the generation's ``max_length`` (``max_new_tokens + 1``)."""
        config = model_utils.unwrap(self.model).generation_config
        max_length = getattr(config, "max_length", None) or 20  # generate()'s own default
        if tensor.shape[-1] < max_length:
            return self._pad_tensors_to_max_len(tensor, max_length)
        max_new = getattr(config, "max_new_tokens", None)
        if max_new is not None and tensor.shape[-1] < max_new + 1:
            return self._pad_tensors_to_max_len(tensor, max_new + 1)
        return tensor

    def _pad_tensors_to_max_len(self, tensor: torch.Tensor, max_length: int) -> torch.Tensor:
        """Right-pad ``tensor`` to ``max_length`` with the tokenizer's pad token (its EOS token when it has no pad
        token), else the model config's ``pad_token_id``."""
        pad_id = None
        if self.processing_class is not None and hasattr(self.processing_class, "pad_token_id"):
            pad_id = self.processing_class.pad_token_id
            if pad_id is None:
                pad_id = getattr(self.processing_class, "eos_token_id", None)
        if pad_id is None:
            pad_id = getattr(getattr(self.model, "config", None), "pad_token_id", None)
        if pad_id is None:
            raise ValueError(
                "Seq2SeqTrainer pads generated ids to one length and needs a pad token: set pad_token_id on the "
                "model's config, or pass a processing_class (tokenizer) with a pad or EOS token."
            )
        padded = torch.full((tensor.shape[0], max_length), pad_id, dtype=tensor.dtype, device=tensor.device)
        padded[:, : tensor.shape[-1]] = tensor
        return padded
