"""The default collator and the padding helpers every other collator shares.

Owns: ``default_data_collator`` / ``DefaultDataCollator`` (stack already-equal-length features), the
``return_tensors`` check, padding-strategy normalization, the arithmetic of a padded length
(``pad_to_multiple_of``), padding one sequence on the tokenizer's side, and ``pad_features``: pad a list of
feature dicts with the tokenizer's own ``pad()`` when it has one, or with the built-in fallback otherwise.

The task-specific collators (padding, language modeling, seq2seq, ...) live in sibling modules and only
combine these helpers. Everything returns ``torch`` tensors; numpy is only touched when the features
already hold numpy arrays (it is never imported here: an array can only exist if numpy is loaded).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trainwell.outputs import enum_value

#: What a collator is: a list of examples in, one batch out (the type of ``Trainer(data_collator=...)``).
DataCollator = Callable[[list[Any]], dict[str, Any]]

#: Value that PyTorch losses ignore; labels are padded with it.
LABEL_PAD_ID = -100

# A tokenizer whose ``model_max_length`` is above this has no real limit (the reference stores 1e30 there).
_NO_LIMIT = int(1e20)

_STRATEGIES = ("longest", "max_length", "do_not_pad")

_LABEL_KEYS = ("label", "label_ids", "labels")


def check_return_tensors(return_tensors: Any) -> None:
    """Raise ``ValueError`` unless ``return_tensors`` is ``"pt"`` (torch) or ``"np"`` (numpy)."""
    if return_tensors not in ("pt", "np"):
        raise ValueError(
            f"return_tensors={return_tensors!r} is not supported: trainwell collators return torch tensors ('pt', "
            "the default) or numpy arrays ('np'); TensorFlow ('tf') is not offered."
        )


def as_requested(batch: dict[str, Any], return_tensors: str | None) -> dict[str, Any]:
    """``batch`` (built with torch) as the caller asked: unchanged for ``"pt"``, numpy arrays for ``"np"``.

    Collators compute in torch (one implementation, one RNG for masking) and convert at the end; the arrays
    have the tensors' dtypes (``int64`` ids and labels, ``float32`` floats).
    """
    check_return_tensors(return_tensors)
    if return_tensors == "np":
        return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch


def normalize_padding(padding: Any) -> str:
    """Map a ``padding`` argument to ``"longest"``, ``"max_length"`` or ``"do_not_pad"``.

    Accepts what the reference accepts: ``True`` / ``"longest"``, ``"max_length"``, ``False`` /
    ``"do_not_pad"``, or a ``PaddingStrategy``-like enum whose ``value`` is one of those strings.
    """
    if padding is True:
        return "longest"
    if padding is False or padding is None:
        return "do_not_pad"
    value = enum_value(padding)
    if isinstance(value, str) and value in _STRATEGIES:
        return value
    raise ValueError(
        f"padding={padding!r} is not a padding strategy: pass True or 'longest', 'max_length', "
        "or False or 'do_not_pad'."
    )


def round_up(length: int, multiple: int | None) -> int:
    """Smallest multiple of ``multiple`` that is ``>= length`` (``length`` itself when ``multiple`` is None)."""
    if not multiple:
        return length
    return -(-length // multiple) * multiple


def target_length(
    lengths: Sequence[int], strategy: str, max_length: int | None, pad_to_multiple_of: int | None
) -> int | None:
    """Length every sequence is padded to, or ``None`` when the strategy pads nothing.

    ``"longest"`` pads to the longest of ``lengths``; ``"max_length"`` to ``max_length``; both are then
    rounded up to ``pad_to_multiple_of``. Sequences longer than the target are left alone (padding never
    truncates), exactly like the reference.
    """
    if strategy == "do_not_pad" or not lengths:
        return None
    if strategy == "max_length":
        if max_length is None:
            return None
        return round_up(max_length, pad_to_multiple_of)
    return round_up(max(lengths), pad_to_multiple_of)


def padding_side_of(tokenizer: Any) -> str:
    """The tokenizer's ``padding_side`` (``"right"`` when it has none), checked to be left or right."""
    side = getattr(tokenizer, "padding_side", None) or "right"
    if side not in ("left", "right"):
        raise ValueError(f"tokenizer.padding_side={side!r} is not supported: set it to 'left' or 'right'.")
    return side


def pad_sequence(sequence: list[Any], length: int, value: Any, side: str) -> list[Any]:
    """``sequence`` padded with ``value`` up to ``length`` on ``side``; unchanged when already long enough."""
    missing = length - len(sequence)
    if missing <= 0:
        return list(sequence)
    filler = [value] * missing
    return list(sequence) + filler if side == "right" else filler + list(sequence)


def require_pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's ``pad_token_id``; a clear ``ValueError`` when it has none."""
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None or pad_id < 0:
        raise ValueError(
            f"Padding was requested but the tokenizer ({type(tokenizer).__name__}) has no pad token "
            f"(pad_token_id={pad_id!r}). Set one, e.g. `tokenizer.pad_token = tokenizer.eos_token`, "
            "or pass padding=False when every example already has the same length."
        )
    return pad_id


def is_ndarray(value: Any) -> bool:
    """True for a numpy array, without importing numpy (an array cannot exist unless numpy is loaded)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def is_sequence(value: Any) -> bool:
    """True for a per-token value (list, tuple, 1-D+ tensor or array), False for scalars and strings."""
    if isinstance(value, (list, tuple)):
        return True
    if isinstance(value, torch.Tensor) or is_ndarray(value):
        return value.ndim > 0
    return False


def to_list(value: Any) -> list[Any]:
    """A tensor, array, tuple or list as a plain Python list."""
    if isinstance(value, torch.Tensor) or is_ndarray(value):
        return value.tolist()
    return list(value)


def to_tensor(values: list[Any], key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Stack one key's per-example values into a tensor, naming the key if they do not line up."""
    try:
        first = values[0]
        if isinstance(first, torch.Tensor):
            stacked = torch.stack(values)
        elif is_ndarray(first):
            stacked = torch.from_numpy(sys.modules["numpy"].stack(values))
        else:
            return torch.tensor(values, dtype=dtype)
        return stacked if dtype is None else stacked.to(dtype)
    except (RuntimeError, ValueError, TypeError) as err:
        raise ValueError(
            f"Cannot batch the '{key}' values into one tensor: they probably have different lengths. "
            "Use a padding collator with padding=True (or 'max_length' with max_length=...), or make every "
            "example the same length."
        ) from err


def as_mappings(features: Sequence[Any]) -> list[Mapping[str, Any]]:
    """Features as Mappings: objects (e.g. dataclass instances) go through ``vars()``."""
    if not features:
        raise ValueError("Cannot collate an empty list of features: the batch has no examples.")
    if isinstance(features[0], Mapping):
        return list(features)
    return [vars(feature) for feature in features]


def label_key(row: Mapping[str, Any]) -> str:
    """The key examples keep their labels under, judged by the first: ``label`` if it has one, else ``labels``
    (which it may not have either)."""
    return "label" if "label" in row else "labels"


def split_labels(rows: list[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """``(label key, the rows without that key)``: labels are taken out before the inputs are padded, since a
    tokenizer's ``pad()`` does not know how to pad them; the caller pads them itself."""
    name = label_key(rows[0])
    return name, [{k: v for k, v in row.items() if k != name} for row in rows]


# ----------------------------------------------------------------------------------------------------------
# default_data_collator


def _label_dtype(sample: Any) -> torch.dtype:
    # As in the reference: an integer (Python, numpy or bool) is a class index, anything else a regression
    # target. A one-element tensor or array is judged by its Python value.
    if (isinstance(sample, torch.Tensor) or is_ndarray(sample)) and sample.ndim == 0:
        sample = sample.item()
    np = sys.modules.get("numpy")
    integer_types = (int, np.integer) if np is not None else (int,)
    return torch.long if isinstance(sample, integer_types) else torch.float


def _collate_labels(first: Mapping[str, Any], features: list[Mapping[str, Any]]) -> torch.Tensor | None:
    if first.get("label") is not None:
        label = first["label"]
        if isinstance(label, torch.Tensor) and label.numel() > 1:
            return to_tensor([f["label"] for f in features], "label")  # multi-label vectors keep their dtype
        return to_tensor([f["label"] for f in features], "label", _label_dtype(label))
    label_ids = first.get("label_ids")
    if label_ids is None:
        return None
    values = [f["label_ids"] for f in features]
    if isinstance(label_ids, torch.Tensor):
        return to_tensor(values, "label_ids")  # a tensor keeps its dtype, as in the reference
    return to_tensor(values, "label_ids", _label_dtype(label_ids[0]))


def default_data_collator(features: Sequence[Any], return_tensors: str | None = "pt") -> dict[str, torch.Tensor]:
    """Stack a list of equal-shaped examples into a batch of torch tensors, without padding.

    * ``features`` are Mappings, or objects whose attributes are read with ``vars()``. The keys of the first
      feature decide which keys the batch has.
    * ``label`` (one value per example) and, when there is no ``label``, ``label_ids`` (a sequence per
      example) become ``labels``: ``long`` for integers, ``float32`` otherwise; a ``label_ids`` tensor keeps
      its dtype.
    * Every other key is stacked: tensors with ``torch.stack``, numpy arrays through ``numpy.stack``,
      lists and numbers with ``torch.tensor``. Keys whose first value is a ``str`` or ``None`` are dropped.
    * ``return_tensors="np"`` gives numpy arrays of the same values (see :func:`as_requested`).
    """
    kind = "pt" if return_tensors is None else return_tensors
    check_return_tensors(kind)
    rows = as_mappings(features)
    first = rows[0]
    batch: dict[str, torch.Tensor] = {}
    labels = _collate_labels(first, rows)
    if labels is not None:
        batch["labels"] = labels
    for key, value in first.items():
        if key in ("label", "label_ids") or value is None or isinstance(value, str):
            continue
        batch[key] = to_tensor([row[key] for row in rows], key)
    return as_requested(batch, kind)


def torch_default_data_collator(features: Sequence[Any]) -> dict[str, torch.Tensor]:
    """:func:`default_data_collator` with ``return_tensors="pt"`` (the reference's name for its torch path)."""
    return default_data_collator(features, "pt")


def numpy_default_data_collator(features: Sequence[Any]) -> dict[str, Any]:
    """:func:`default_data_collator` with ``return_tensors="np"`` (the reference's name for its numpy path).

    The arrays have the dtypes of the torch path (see :func:`as_requested`): float features are ``float32``,
    where the reference's ``numpy.array`` makes ``float64``.
    """
    return default_data_collator(features, "np")


@dataclass
class DefaultDataCollator:
    """Object form of :func:`default_data_collator`, for APIs that want a collator instance.

    ``return_tensors`` is ``"pt"`` or ``"np"`` (checked at construction and on every call).
    """

    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        check_return_tensors(self.return_tensors)

    def __call__(self, features: Sequence[Any], return_tensors: str | None = None) -> dict[str, torch.Tensor]:
        return default_data_collator(features, return_tensors or self.return_tensors)


# ----------------------------------------------------------------------------------------------------------
# pad_features: the tokenizer's pad() when it exists, else the built-in fallback


def _pad_value(key: str, tokenizer: Any, main_input: str) -> Any:
    """What a key is padded with in the fallback, or ``None`` when the key is not padded."""
    if key == main_input:
        return tokenizer.pad_token_id
    if key == "attention_mask":
        return 0
    if key == "token_type_ids":
        return getattr(tokenizer, "pad_token_type_id", None) or 0
    if key == "special_tokens_mask":
        return 1  # padding is "special": never masked, never scored
    if key in _LABEL_KEYS:
        return LABEL_PAD_ID
    if key == "offset_mapping":
        return [0, 0]
    return None


def _model_input_names(tokenizer: Any) -> list[str]:
    names = getattr(tokenizer, "model_input_names", None)
    return list(names) if names else ["input_ids", "attention_mask"]


def _fallback_pad(
    tokenizer: Any,
    features: list[Mapping[str, Any]],
    strategy: str,
    max_length: int | None,
    pad_to_multiple_of: int | None,
) -> dict[str, torch.Tensor]:
    names = _model_input_names(tokenizer)
    main_input = names[0]
    if main_input not in features[0]:
        raise ValueError(
            f"Cannot pad: the features have no '{main_input}' (the tokenizer's first model input); "
            f"they have {list(features[0])}."
        )
    columns = {key: [f[key] for f in features] for key in features[0]}
    if "attention_mask" in names and "attention_mask" not in columns:
        columns["attention_mask"] = [[1] * len(seq) for seq in columns[main_input]]
    if strategy == "max_length" and max_length is None:
        limit = getattr(tokenizer, "model_max_length", None)
        # Like the reference: with no usable model limit there is nothing to pad to.
        if limit is None or limit > _NO_LIMIT:
            strategy = "do_not_pad"
        max_length = limit
    if strategy != "do_not_pad":
        require_pad_token_id(tokenizer)
    side = padding_side_of(tokenizer)
    batch: dict[str, torch.Tensor] = {}
    for key, values in columns.items():
        if values[0] is None or isinstance(values[0], str):
            continue  # nothing to batch; the default collator drops these too
        value = _pad_value(key, tokenizer, main_input)
        if value is not None and is_sequence(values[0]):
            rows = [to_list(v) for v in values]
            length = target_length([len(r) for r in rows], strategy, max_length, pad_to_multiple_of)
            if length is not None:
                rows = [pad_sequence(r, length, value, side) for r in rows]
            values = rows
        batch[key] = to_tensor(values, key)
    return batch


def pad_features(
    tokenizer: Any,
    features: Sequence[Any],
    padding: Any = True,
    max_length: int | None = None,
    pad_to_multiple_of: int | None = None,
    return_tensors: str = "pt",
) -> Any:
    """Pad a list of feature dicts to one rectangular batch of torch tensors.

    When ``tokenizer`` has a ``pad`` method (any Hugging Face tokenizer or feature extractor) it is called
    exactly as the reference collators call it:
    ``tokenizer.pad(features, padding=..., max_length=..., pad_to_multiple_of=..., return_tensors=...)``
    and its result (e.g. a ``BatchEncoding``) is returned unchanged.

    Otherwise the built-in fallback pads on ``tokenizer.padding_side`` (default ``"right"``): the first of
    ``tokenizer.model_input_names`` (default ``input_ids``) with ``pad_token_id``, ``attention_mask`` with 0
    (and creates it when the tokenizer lists it as a model input), ``token_type_ids`` with
    ``pad_token_type_id`` (or 0), ``special_tokens_mask`` with 1, and sequence-valued ``label`` /
    ``label_ids`` / ``labels`` with -100. Other keys are stacked as they are; ``str`` and ``None`` values
    are dropped. Padding without a ``pad_token_id`` raises ``ValueError``.
    """
    check_return_tensors(return_tensors)
    if callable(getattr(tokenizer, "pad", None)):
        return tokenizer.pad(
            features,
            padding=padding,
            max_length=max_length,
            pad_to_multiple_of=pad_to_multiple_of,
            return_tensors=return_tensors,
        )
    strategy = normalize_padding(padding)
    return _fallback_pad(tokenizer, as_mappings(features), strategy, max_length, pad_to_multiple_of)


class PaddingCollatorMixin:
    """What the padding collators share: the option checks (at construction and per call) and the call to
    :func:`pad_features`.

    For dataclass collators that declare ``tokenizer``, ``padding``, ``max_length``, ``pad_to_multiple_of``
    and ``return_tensors`` themselves. The fields stay in each class, not here: a dataclass base would put its
    fields before the subclass's, and the reference's positional order differs between collators (``model``
    comes second in ``DataCollatorForSeq2Seq``, ``label_pad_token_id`` before ``return_tensors`` in two).
    A plain class contributes no fields, so every constructor keeps the reference's signature.
    """

    tokenizer: Any
    padding: Any
    max_length: int | None
    pad_to_multiple_of: int | None
    return_tensors: str

    def __post_init__(self) -> None:
        check_return_tensors(self.return_tensors)
        normalize_padding(self.padding)  # a bad value fails here, not in the first training step

    def _return_tensors(self, requested: str | None) -> str:
        """A call's ``return_tensors`` (the collator's own when ``None``), checked to be ``"pt"`` or ``"np"``."""
        return_tensors = requested or self.return_tensors
        check_return_tensors(return_tensors)
        return return_tensors

    def _pad_inputs(self, features: Sequence[Any]) -> Any:
        """:func:`pad_features` with this collator's tokenizer and padding options, as torch tensors (a call
        that asked for numpy converts at the end, :func:`as_requested`)."""
        return pad_features(
            self.tokenizer,
            features,
            padding=self.padding,
            max_length=self.max_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
            return_tensors="pt",
        )


def collate_token_sequences(
    examples: Sequence[Any], tokenizer: Any, pad_to_multiple_of: int | None = None
) -> torch.Tensor:
    """Batch bare token sequences (lists, arrays or 1-D tensors) into one ``(batch, length)`` tensor.

    Sequences that already share a length (a multiple of ``pad_to_multiple_of`` when given) are stacked
    as they are; otherwise they are padded with ``pad_token_id`` on the tokenizer's padding side, which
    requires a pad token.
    """
    if not examples:
        raise ValueError("Cannot collate an empty list of examples: the batch has no examples.")
    rows = [e if isinstance(e, torch.Tensor) else torch.as_tensor(to_list(e), dtype=torch.long) for e in examples]
    lengths = [len(r) for r in rows]
    length = round_up(max(lengths), pad_to_multiple_of)
    if all(n == length for n in lengths):
        return torch.stack(rows)
    pad_id = require_pad_token_id(tokenizer)
    side = padding_side_of(tokenizer)
    batch = rows[0].new_full((len(rows), length), pad_id)
    for i, row in enumerate(rows):
        if side == "right":
            batch[i, : len(row)] = row
        else:
            batch[i, length - len(row) :] = row
    return batch


class DataCollatorMixin:
    """Base of the reference's collators: ``__call__(features, return_tensors=None)`` dispatches to
    ``torch_call`` / ``numpy_call`` (``tf_call`` for TensorFlow) by ``return_tensors`` (the call's, else the
    instance's ``return_tensors`` attribute). Subclass it and define the calls your collator supports."""

    return_tensors: str = "pt"

    def __call__(self, features: list[Any], return_tensors: str | None = None) -> Any:
        kind = return_tensors if return_tensors is not None else self.return_tensors
        method = {"pt": "torch_call", "np": "numpy_call", "tf": "tf_call"}.get(kind)
        if method is None:
            raise ValueError(f"return_tensors={kind!r}: use 'pt' (torch) or 'np' (numpy).")
        if not hasattr(self, method):
            raise NotImplementedError(f"{type(self).__name__} defines no {method} for return_tensors={kind!r}.")
        return getattr(self, method)(features)
