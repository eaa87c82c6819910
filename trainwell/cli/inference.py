"""Using a model ``trainwell train`` trained with a ``task``: ``load_trained(path)`` and ``TrainedModel.predict``.

Owns finding what a run saved (a run's ``output_dir``, one of its ``checkpoint-N`` folders, or the config that
trained it), reading it back (``task.json``, the tokenizer, the model: a built-in rebuilt from the keyword
arguments ``task.json`` records, or a ``transformers`` model from its ``config.json``), and predicting: labels
with their probabilities for text classification, a continuation for a causal LM. Nothing is downloaded and no
code from the folder runs unless the caller trusts it (``trust_remote_code=True``, ``--trust-remote-code``: a
custom ``transformers`` model or tokenizer class its config names); ``trust_remote_code=False`` is passed to
``transformers`` explicitly, so it never asks on stdin. Weights are read with safetensors; ``task.json`` is read as
a regular file of the folder (bounded) and every value in it checked, a built-in model rebuilt on the ``meta``
device and matched with the weights file before any memory is allocated. Reading input files and writing
predictions belong to ``trainwell.cli.predict``; what a task is, to ``trainwell.cli.tasks``.

In Python::

    from trainwell.cli.inference import load_trained

    trained = load_trained("runs/sentiment")
    trained.predict(["a lovely film"])  # [{"text": "a lovely film", "label": "pos", "score": 0.97, ...}]
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainwell.cli import CliError
from trainwell.cli.tasks import TASK_FILE, TASKS, Task
from trainwell.cli.tokenizer import ByteTokenizer, TextTokenizer, load_tokenizer

_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_NOT_A_RUN = ("pass the output_dir of a `trainwell demo` run or of a `trainwell train` run with a task: section "
              "(text-classification or causal-lm), one of its checkpoint-N folders, or the config file that trained it")


# --- finding and reading what a run saved -------------------------------------------------------------------------


def run_folder(path: str | os.PathLike[str], newest_checkpoint: bool = False) -> str:
    """The folder holding ``task.json`` that ``path`` names: the folder itself, or the ``output_dir`` of a config
    file (relative to the current directory, as ``trainwell train`` writes it); with ``newest_checkpoint``, a run
    that has not saved its final model (interrupted, or still training) gives its newest checkpoint holding one.
    ``CliError`` saying what the folder is instead and what to pass, when it holds no model trained with a task."""
    path = os.fspath(path)
    if os.path.isfile(path) and os.path.basename(path) == TASK_FILE:
        path = os.path.dirname(path) or "."
    elif os.path.isfile(path) and path.lower().endswith(_CONFIG_SUFFIXES):
        path = _config_output_dir(path)
    if not os.path.exists(path):
        raise CliError(f"{path!r}: no such folder (in {os.getcwd()}); {_NOT_A_RUN}.")
    if not os.path.isdir(path):
        raise CliError(f"{path!r} is a file, not a run folder; {_NOT_A_RUN}.")
    if os.path.lexists(os.path.join(path, TASK_FILE)):  # a link or a FIFO there is named when it is read
        return path
    if newest_checkpoint:
        from trainwell.checkpoint.resume import get_last_checkpoint

        newest = get_last_checkpoint(path)
        if newest is not None and os.path.isfile(os.path.join(newest, TASK_FILE)):
            return newest
    raise CliError(_why_not_a_run(path))


def _config_output_dir(config_path: str) -> str:
    from trainwell.cli.config import read_config

    config = read_config(config_path)
    if config.get("task") is None:
        raise CliError(f"{config_path} is a file without a task: section, not the config of a `trainwell train` "
                       f"run with a task; {_NOT_A_RUN}.")
    return str(config.get("output_dir") or "trainer_output")


def _why_not_a_run(path: str) -> str:
    from trainwell.checkpoint.resume import get_last_checkpoint

    newest = get_last_checkpoint(path)
    if newest is not None and os.path.isfile(os.path.join(newest, TASK_FILE)):
        return (f"{path} has no {TASK_FILE} yet (the run has not finished, or stopped before saving its model), "
                f"but its newest checkpoint has one: pass {newest}.")
    if any(os.path.isfile(os.path.join(path, name)) for name in ("model.safetensors", "trainer_state.json",
                                                                 "pytorch_model.bin")):
        return (f"{path} holds a model trained without a task: section (it has no {TASK_FILE}), so trainwell does "
                "not know how to rebuild it or read its input: build it as you did for training and load its "
                "weights (model.load_state_dict(safetensors.torch.load_file('model.safetensors'))), or "
                "load_trained(path, model=your_model) when it was trained with a task and a factory.")
    return f"{path} is not a trainwell run: it has no {TASK_FILE}; {_NOT_A_RUN}."


_TASK_LIMIT = 16 << 20  # bytes of task.json read at most (its labels: a large label set fits)


def read_task(folder: str) -> tuple[Task, dict[str, Any]]:
    """``(Task, the whole task.json)``; ``CliError`` naming the file and the value when it is not one
    ``trainwell train`` wrote (not a regular file of the folder, not JSON, or a value of the wrong kind)."""
    from trainwell.cli.tasks import parse_task
    from trainwell.utils.safe_files import read_json

    file = os.path.join(folder, TASK_FILE)
    try:
        saved = read_json(file, _TASK_LIMIT, root=folder)
    except (OSError, ValueError) as err:
        raise CliError(f"{err}; {_NOT_A_RUN}.") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("task"), str) or saved["task"] not in TASKS:
        found = saved.get("task") if isinstance(saved, dict) else saved
        raise CliError(f"{file}: task {found!r} is not one of {', '.join(TASKS)}; it was not written by "
                       "`trainwell train`.")
    spec = {"name": saved["task"], **{k: saved[k] for k in TASKS[saved["task"]][0] if k != "name" and k in saved}}
    try:
        task = parse_task(spec)
    except CliError as err:
        raise CliError(f"{file}: {err}") from None
    labels = saved.get("labels")
    if task.name == "text-classification" and not (isinstance(labels, list) and labels and all(
            isinstance(v, (str, int)) and not isinstance(v, bool) for v in labels)):
        raise CliError(f"{file}: a text-classification task.json needs its 'labels' (in id order: a list of names or "
                       f"numbers), not {labels!r:.80}.")
    for key in ("pad_token_id", "eos_token_id"):
        if saved.get(key) is not None and not (isinstance(saved[key], int) and not isinstance(saved[key], bool)
                                               and saved[key] >= 0):
            raise CliError(f"{file}: {key}={saved[key]!r:.80} is not a token id (a whole number, 0 or more).")
    return task, saved


def _tokenizer(folder: str, saved: dict[str, Any], trust_remote_code: bool) -> TextTokenizer:
    """The tokenizer saved beside the model: a transformers tokenizer folder when it wrote one (and transformers
    is installed), else its ``tokenizer.json``; the special ids the run used come from ``task.json``."""
    import importlib.util

    if saved.get("tokenizer") == ByteTokenizer.NAME:  # the demo's: bytes are the ids, nothing to read
        return ByteTokenizer()
    has_config = os.path.isfile(os.path.join(folder, "tokenizer_config.json"))
    if has_config and importlib.util.find_spec("transformers") is not None:
        tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)
    elif os.path.isfile(os.path.join(folder, "tokenizer.json")):
        tokenizer = load_tokenizer(os.path.join(folder, "tokenizer.json"))
    else:
        raise CliError(f"{folder}: no tokenizer.json beside {TASK_FILE}" + (
            " (reading the transformers tokenizer files there needs transformers: pip install transformers)"
            if has_config else "") + ".")
    for key in ("pad_token_id", "eos_token_id"):
        if isinstance(saved.get(key), int):  # a token the config named, or the causal LM's stand-in pad
            setattr(tokenizer, key, saved[key])
    return tokenizer


def _build_model(folder: str, task: Task, saved: dict[str, Any], trust_remote_code: bool) -> nn.Module:
    """The model ``task.json`` describes, with the folder's weights."""
    from trainwell.checkpoint.io import load_model_weights
    from trainwell.cli.models import BUILTINS

    note = saved.get("model")
    if isinstance(note, dict) and note.get("builtin") in BUILTINS:
        model = _builtin(folder, note)
        try:
            load_model_weights(model, folder)
        except (OSError, ValueError, RuntimeError) as err:
            raise CliError(f"{folder}: cannot load the {note['builtin']} model's weights ({err}).") from None
        return model
    if os.path.isfile(os.path.join(folder, "config.json")):
        return _transformers_model(folder, TASKS[task.name][1], trust_remote_code)
    raise CliError(f"{folder}: the model came from the factory {note!r:.200}, which trainwell cannot rebuild by "
                   "itself; in Python, build it as the config does and pass it: load_trained(path, "
                   "model=build_model()).")


def _builtin(folder: str, note: dict[str, Any]) -> nn.Module:
    """A built-in model as ``task.json`` records it (``{"builtin": name, "kwargs": {...}}``): its keyword arguments
    checked against the factory, the model built first on the ``meta`` device (no memory) and its parameters'
    shapes matched with the weights file's header, so a crafted size is an error, not an allocation."""
    from trainwell.cli.build import check_call
    from trainwell.cli.models import BUILTINS

    name, kwargs = note["builtin"], note.get("kwargs") or {}
    factory, file = BUILTINS[name][1], os.path.join(folder, TASK_FILE)
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise CliError(f"{file}: model.kwargs={kwargs!r:.80} is not a mapping of keyword arguments.")
    try:
        check_call(factory, kwargs, "model", f"builtin {name}")
        with torch.device("meta"):
            shapes = {k: tuple(v.shape) for k, v in factory(**kwargs).state_dict().items()}
    except CliError as err:
        raise CliError(f"{file}: {err}") from None
    except (TypeError, ValueError, RuntimeError, OverflowError) as err:
        raise CliError(f"{file}: the {name} model cannot be built from {kwargs!r:.200} ({err}).") from None
    saved = _weight_shapes(folder)
    differ = sorted(k for k in shapes if k in saved and saved[k] != shapes[k])
    if differ or not set(saved) <= set(shapes):
        key = differ[0] if differ else sorted(set(saved) - set(shapes))[0]
        raise CliError(f"{file}: its model ({name}, {kwargs!r:.200}) does not match the weights beside it: {key} is "
                       f"{saved.get(key)} there, {shapes.get(key)} in that model. The folder's files do not belong "
                       "together.")
    return factory(**kwargs)


def _weight_shapes(folder: str) -> dict[str, tuple[int, ...]]:
    """The tensors' shapes in the folder's ``model.safetensors`` (its header only, read through one descriptor
    opened relative to the folder's: nothing else is read, and the name is not opened again)."""
    from trainwell.checkpoint.io import WEIGHTS_NAME
    from trainwell.utils.safe_files import open_regular, parse_json

    path = os.path.join(folder, WEIGHTS_NAME)
    try:
        with open_regular(path, folder) as fh:
            length = int.from_bytes(fh.read(8), "little")
            if not 0 < length <= _HEADER_LIMIT:
                raise CliError(f"{folder}: {WEIGHTS_NAME} is not a safetensors file (a header of {length} bytes).")
            header = parse_json(fh.read(length), path)
        return {key: tuple(value["shape"]) for key, value in header.items() if key != "__metadata__"}
    except CliError:
        raise
    except (OSError, ValueError) as err:
        raise CliError(f"{folder}: cannot read {WEIGHTS_NAME} ({err}).") from None
    except (TypeError, KeyError, AttributeError) as err:
        raise CliError(f"{folder}: {WEIGHTS_NAME} is not a safetensors file ({type(err).__name__}: {err}).") from None


_HEADER_LIMIT = 100 << 20  #: safetensors' own bound on a header


def _transformers_model(folder: str, auto_class: str, trust_remote_code: bool) -> nn.Module:
    try:
        import transformers
    except ImportError:
        raise ImportError(f"{folder} holds a transformers model: reading it needs transformers: pip install "
                          "transformers.") from None
    try:
        return getattr(transformers, auto_class).from_pretrained(folder, local_files_only=True,
                                                                 trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as err:
        said = " ".join(str(err).split())  # transformers' messages span lines: the error is one
        raise CliError(f"{folder}: cannot load a {auto_class} from it ({said}){_remote_code_hint(err)}.") from None


def _remote_code_hint(err: BaseException) -> str:
    """What to do when the folder's config names code of its own (``auto_map``), which runs only when trusted."""
    if "trust_remote_code" not in str(err):
        return ""
    return ("; its config names code of its own (auto_map), which trainwell runs only when you trust the folder: "
            "pass --trust-remote-code (in Python, load_trained(path, trust_remote_code=True)) after reading that code")


def _device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        from trainwell.cli import no_cuda_message

        raise CliError(no_cuda_message("--device cuda"))
    return torch.device(device)


def load_trained(path: str | os.PathLike[str], model: nn.Module | None = None, device: str = "cpu",
                 trust_remote_code: bool = False) -> TrainedModel:
    """The model, tokenizer and task a ``trainwell train`` run with a ``task`` saved in ``path`` (its
    ``output_dir``, a ``checkpoint-N`` folder, or the config file that trained it), ready to ``predict``.

    ``model``: a module built as the run built it, for a model made by a factory (its weights are loaded from
    the folder); built-in and ``transformers`` models are rebuilt from what the folder holds. ``device``:
    ``cpu``, ``cuda``, ``mps`` or ``auto`` (a GPU when there is one). ``trust_remote_code``: let ``transformers``
    run the code a folder's config names (a custom model or tokenizer class); off, such a folder is an error that
    says so. Raises ``CliError`` for a folder that is not such a run, its message saying what the folder is and
    what to pass instead.
    """
    folder = run_folder(path)
    task, saved = read_task(folder)
    tokenizer = _tokenizer(folder, saved, trust_remote_code)
    if model is not None:
        from trainwell.checkpoint.io import load_model_weights

        load_model_weights(model, folder)
    else:
        model = _build_model(folder, task, saved, trust_remote_code)
    target = _device(device)
    model.to(target).eval()
    return TrainedModel(task, model, tokenizer, saved.get("labels"), folder, target)


# --- predicting -----------------------------------------------------------------------------------------------------


def _logits(output: Any) -> torch.Tensor:
    if isinstance(output, dict) or hasattr(output, "keys"):
        return output["logits"]
    return output[0] if isinstance(output, (tuple, list)) else output


@dataclass
class TrainedModel:
    """A trained model with its tokenizer and task; ``predict(texts)`` gives one dict per text."""

    task: Task
    model: nn.Module
    tokenizer: TextTokenizer
    labels: list[Any] | None
    path: str
    device: torch.device

    def predict(self, texts: Sequence[str], batch_size: int = 32, max_new_tokens: int = 50,
                temperature: float = 0.0, top_k: int = 40, seed: int = 0) -> list[dict[str, Any]]:
        """Text classification: ``{"text", "label", "score", "scores"}`` (the most probable label, its
        probability, and every label's); causal LM: ``{"text", "generated"}`` (up to ``max_new_tokens`` tokens
        after the text, stopping at the end-of-text token; ``temperature`` 0 picks the most probable token,
        above 0 samples among the ``top_k`` most probable, reproducibly for a ``seed``). ``batch_size`` texts
        are classified at once; texts are truncated to the task's ``max_length`` as in training."""
        texts = list(texts)
        for number, text in enumerate(texts, 1):
            if not isinstance(text, str) or not text:
                raise CliError(f"text {number} is {text!r}: pass a non-empty string.")
        if self.task.name == "text-classification":
            if batch_size < 1:
                raise CliError(f"batch_size={batch_size}: pass a positive number of texts per batch.")
            return [row for start in range(0, len(texts), batch_size)
                    for row in self._classify(texts[start:start + batch_size])]
        if max_new_tokens < 1 or temperature < 0 or top_k < 0:
            raise CliError(f"max_new_tokens={max_new_tokens}, temperature={temperature}, top_k={top_k}: pass at "
                           "least one new token, a temperature of 0 (the most probable token) or more, and a "
                           "top_k of 0 (all tokens) or more.")
        return [{"text": text, "generated": self._generate(text, max_new_tokens, temperature, top_k, seed + i)}
                for i, text in enumerate(texts)]

    @torch.inference_mode()
    def _classify(self, texts: list[str]) -> list[dict[str, Any]]:
        from trainwell.data.collators import DataCollatorWithPadding

        encoded = self.tokenizer.encode(texts, self.task.max_length)
        batch = DataCollatorWithPadding(self.tokenizer)([{"input_ids": ids} for ids in encoded])
        batch = {k: v.to(self.device) for k, v in batch.items()}
        probabilities = torch.softmax(_logits(self.model(**batch)).float(), dim=-1).cpu()
        labels = self.labels or list(range(probabilities.shape[-1]))
        if len(labels) != probabilities.shape[-1]:
            raise CliError(f"{self.path}: task.json names {len(labels)} labels, but the model scores "
                           f"{probabilities.shape[-1]}: the folder's files do not belong together.")
        rows = []
        for text, row in zip(texts, probabilities.tolist()):
            best = max(range(len(row)), key=row.__getitem__)
            rows.append({"text": text, "label": labels[best], "score": row[best],
                         "scores": {str(label): p for label, p in zip(labels, row)}})
        return rows

    def _context(self) -> int:
        """How many tokens the model sees at once: its position table, else the task's sequence length."""
        config = getattr(self.model, "config", None)
        for key in ("block_size", "n_positions", "max_position_embeddings"):
            value = getattr(config, key, None)
            if isinstance(value, int) and value > 0:
                return value
        return self.task.length

    @torch.inference_mode()
    def _generate(self, text: str, max_new_tokens: int, temperature: float, top_k: int, seed: int) -> str:
        eos = self.tokenizer.eos_token_id
        prompt = self.tokenizer.encode([text])[0]
        if prompt and prompt[-1] == eos:  # a tokenizer that ends every text: continue the text, not after it
            prompt = prompt[:-1]
        if not prompt:
            raise CliError(f"text {text!r} makes no token to continue from: pass a longer prompt.")
        generator = torch.Generator().manual_seed(seed)
        ids, context = list(prompt), self._context()
        for _ in range(max_new_tokens):
            window = torch.tensor([ids[-context:]], device=self.device)
            logits = _logits(self.model(input_ids=window))[0, -1].float().cpu()
            if temperature == 0:
                token = int(logits.argmax())
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
            if token == eos:
                break
            ids.append(token)
        # Decoded together with the prompt, so the space (or none) between them is the tokenizer's own.
        start, whole = self.tokenizer.decode(prompt), self.tokenizer.decode(ids)
        return whole[len(start):] if whole.startswith(start) else self.tokenizer.decode(ids[len(prompt):])


__all__ = ["TrainedModel", "load_trained", "read_task", "run_folder"]
