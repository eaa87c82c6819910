"""The ``tokenizer`` section of a ``trainwell train`` config: a local tokenizer, behind one small interface.

Owns ``TextTokenizer`` (encode texts to id lists; ``pad_token_id``, ``eos_token_id``, ``vocab_size``;
``save_pretrained`` so the Trainer writes it into every checkpoint and the final model folder) and
``load_tokenizer``, which reads either

* a ``tokenizer.json`` file, with the ``tokenizers`` package (no ``transformers`` needed), or
* a folder: a ``transformers`` tokenizer (``AutoTokenizer.from_pretrained(folder, local_files_only=True)``) when
  ``transformers`` is installed, else the folder's ``tokenizer.json`` with ``tokenizers``.

Nothing is downloaded: a name that is not an existing file or folder is an error saying where it was looked for.
What the ids are used for (tasks, datasets, models) belongs to ``trainwell.cli.tasks``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from trainwell.cli import CliError
from trainwell.cli.config import ConfigPath
from trainwell.utils.safe_files import staged, write_file

TOKENIZER_KEYS = ("path", "pad_token", "eos_token")
# Tried in order when the config names no pad / end-of-text token (the spellings common tokenizers use).
PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>", "<PAD>", "[pad]")
EOS_TOKENS = ("</s>", "<|endoftext|>", "<eos>", "[EOS]", "<|eos|>", "<|end_of_text|>")
LABELS_FILE = "labels.json"


class TextTokenizer:
    """A tokenizer as the task pipeline and trainwell's collators see it.

    ``encode(texts, max_length)`` returns one list of ids per text (special tokens added, truncated to
    ``max_length`` when given, never padded: padding is the collator's job, per batch); ``decode(ids)`` the
    text. ``pad_token_id``, ``padding_side`` and ``model_input_names`` are what ``trainwell.data.collators`` pad
    with; there is no ``pad()`` method, so trainwell pads itself and both kinds of tokenizer pad the same way.

    ``save_pretrained(folder)`` writes the tokenizer files, plus ``extra_files`` (e.g. ``labels.json``), as JSON.
    """

    padding_side = "right"
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, backend: Any, kind: str, source: str, pad_token_id: int | None, eos_token_id: int | None,
                 vocab_size: int) -> None:
        self.backend = backend  # a tokenizers.Tokenizer or a transformers tokenizer
        self.kind = kind  # "tokenizers" or "transformers"
        self.source = source
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.vocab_size = vocab_size
        self.extra_files: dict[str, Any] = {}

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, texts: list[str], max_length: int | None = None) -> list[list[int]]:
        if self.kind == "transformers":
            truncate = max_length is not None
            return list(self.backend(texts, truncation=truncate, max_length=max_length)["input_ids"])
        # The file may switch padding or truncation on; padding here would defeat the per-batch collator.
        self.backend.no_padding()
        if max_length is None:
            self.backend.no_truncation()
        else:
            self.backend.enable_truncation(max_length)
        return [encoding.ids for encoding in self.backend.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, special tokens left out (both kinds of tokenizer take the same arguments)."""
        return self.backend.decode(list(ids), skip_special_tokens=True)

    def save_pretrained(self, folder: str) -> None:
        """Write the tokenizer (as it was read: the file is copied) and ``extra_files`` into ``folder``."""
        os.makedirs(folder, exist_ok=True)
        if self.kind == "transformers":
            with staged(folder) as stage:  # renamed into place: never written through a link planted in the folder
                self.backend.save_pretrained(str(stage))
        else:
            target = os.path.join(folder, "tokenizer.json")
            if os.path.abspath(self.source) != os.path.abspath(target):
                with open(self.source, "rb") as source:  # the user's tokenizer file, as they named it
                    write_file(target, source.read())  # never through a link planted at the target
        _write_extra_files(folder, self.extra_files)


class ByteTokenizer(TextTokenizer):
    """UTF-8 bytes as the token ids 0-255, no special tokens: the tokenizer of ``trainwell demo``'s byte-level model.

    ``save_pretrained`` writes only ``extra_files`` (the demo's ``task.json``, which names this tokenizer as
    ``"tokenizer": "bytes"``); there is no file to read it back from, and none is needed. Decoding replaces an
    incomplete or invalid UTF-8 sequence with U+FFFD.
    """

    NAME = "bytes"

    def __init__(self, extra_files: dict[str, Any] | None = None) -> None:
        super().__init__(None, self.NAME, "bytes (UTF-8)", None, None, 256)
        self.extra_files = dict(extra_files or {})
        self.model_input_names = ["input_ids"]

    def encode(self, texts: list[str], max_length: int | None = None) -> list[list[int]]:
        return [list(text.encode("utf-8"))[:max_length] for text in texts]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def save_pretrained(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        _write_extra_files(folder, self.extra_files)


def _write_extra_files(folder: str, files: dict[str, Any]) -> None:
    """Each of ``files`` (``task.json``...) as indented JSON, by trainwell's one writer (a temporary name, then a
    rename: a link planted under the name, to ``~/.bashrc`` say, is replaced, never written through)."""
    for name, content in files.items():
        write_file(os.path.join(folder, name), json.dumps(content, indent=2) + "\n")


def _where(given: Any) -> str:
    return given.explain() if isinstance(given, ConfigPath) else f"{str(given)!r} (in {os.getcwd()})"


def _parse_spec(spec: Any) -> dict[str, Any]:
    from trainwell.utils.errors import did_you_mean

    spec = {"path": spec} if isinstance(spec, (str, os.PathLike)) else spec
    if not isinstance(spec, dict) or "path" not in spec:
        raise CliError(f"tokenizer: expected a path to a tokenizer.json file or a tokenizer folder, or "
                       f"{{path: ..., pad_token: ..., eos_token: ...}}, got {spec!r}.")
    for key in spec:
        if key not in TOKENIZER_KEYS:
            raise CliError(f"tokenizer: unknown key {key!r}; allowed: {', '.join(map(repr, TOKENIZER_KEYS))}."
                           + did_you_mean(key, TOKENIZER_KEYS))
    for key in ("pad_token", "eos_token"):
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise CliError(f"tokenizer.{key}={spec[key]!r}: name the token as a string. In YAML and on the command "
                           f"line, quote a token in brackets: {key}: '[PAD]', or --tokenizer.{key} \"'[PAD]'\".")
    return spec


def load_tokenizer(spec: Any, trust_remote_code: bool = False) -> TextTokenizer:
    """The tokenizer a config names: a path, or ``{path, pad_token, eos_token}`` (tokens the file does not mark).

    Raises ``CliError`` when the path does not exist (saying where it looked), when the file is not a tokenizer,
    or when the package it needs is missing (naming the ``pip install``). A ``transformers`` tokenizer folder whose
    config names code of its own runs it only with ``trust_remote_code`` (passed to ``transformers`` explicitly:
    never a question on stdin).
    """
    spec = _parse_spec(spec)
    given = spec["path"]
    path = str(given)
    if os.path.isdir(path):
        if importlib.util.find_spec("transformers") is not None:
            tokenizer = _from_transformers(path, trust_remote_code)
        elif os.path.isfile(os.path.join(path, "tokenizer.json")):
            tokenizer = _from_file(os.path.join(path, "tokenizer.json"))
        else:
            raise CliError(f"tokenizer: {path} is a folder without a tokenizer.json; reading a transformers "
                           "tokenizer folder needs transformers: pip install transformers.")
    elif os.path.isfile(path):
        tokenizer = _from_file(path)
    else:
        raise CliError(f"tokenizer: no such file or folder {_where(given)}. Name a tokenizer.json file or a folder "
                       "holding a saved tokenizer; nothing is downloaded.")
    _apply_tokens(tokenizer, spec.get("pad_token"), spec.get("eos_token"))
    return tokenizer


def _from_file(path: str) -> TextTokenizer:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError(f"tokenizer: reading {path} needs the tokenizers package: pip install tokenizers.") from None
    try:
        backend = Tokenizer.from_file(path)
    except Exception as err:  # noqa: BLE001 - tokenizers raises a bare Exception for a malformed file
        raise CliError(f"tokenizer: {path} is not a tokenizers tokenizer.json file ({err}).") from None
    padding = backend.padding or {}
    pad = padding.get("pad_id") if padding.get("pad_token") else None
    pad = pad if pad is not None else _first_id(backend.token_to_id, PAD_TOKENS)
    eos = _first_id(backend.token_to_id, EOS_TOKENS)
    return TextTokenizer(backend, "tokenizers", path, pad, eos, backend.get_vocab_size(with_added_tokens=True))


def _from_transformers(folder: str, trust_remote_code: bool = False) -> TextTokenizer:
    from transformers import AutoTokenizer

    try:
        backend = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        hint = ("; its config names code of its own (auto_map), which runs only when trusted: pass "
                "--trust-remote-code after reading it") if "trust_remote_code" in str(err) else ""
        said = " ".join(str(err).split())  # transformers' messages span lines: the error is one
        raise CliError(f"tokenizer: cannot read a transformers tokenizer from the folder {folder} ({said}){hint}.") \
            from None
    pad, eos = backend.pad_token_id, backend.eos_token_id
    return TextTokenizer(backend, "transformers", folder, pad, eos, len(backend))


def _first_id(lookup: Any, tokens: tuple[str, ...]) -> int | None:
    return next((lookup(t) for t in tokens if lookup(t) is not None), None)


def _token_id(tokenizer: TextTokenizer, token: str, key: str) -> int:
    if tokenizer.kind == "transformers":
        token_id = tokenizer.backend.get_vocab().get(token)
    else:
        token_id = tokenizer.backend.token_to_id(token)
    if token_id is None:
        raise CliError(f"tokenizer.{key}={token!r}: {tokenizer.source} has no such token; name one of its tokens "
                       "(special tokens are added when the tokenizer is trained).")
    return token_id


def _apply_tokens(tokenizer: TextTokenizer, pad_token: str | None, eos_token: str | None) -> None:
    if pad_token is not None:
        tokenizer.pad_token_id = _token_id(tokenizer, pad_token, "pad_token")
    if eos_token is not None:
        tokenizer.eos_token_id = _token_id(tokenizer, eos_token, "eos_token")


def require_pad_token(tokenizer: TextTokenizer, task: str) -> int:
    """The pad id, or a ``CliError`` naming the tokens looked for and how to name one."""
    if tokenizer.pad_token_id is None:
        raise CliError(f"tokenizer: {tokenizer.source} has no padding token (looked for {', '.join(PAD_TOKENS)}), "
                       f"which {task} needs to batch texts of different lengths. Name one of its tokens: "
                       f"tokenizer: {{path: ..., pad_token: '<its pad token>'}}, or add '[PAD]' to its "
                       "special tokens when training it.")
    return tokenizer.pad_token_id
