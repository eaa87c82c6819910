"""trainwell underneath the libraries that subclass the reference's Trainer (TRL, sentence-transformers, ...).

Such a library fixes its base class when it is imported: ``class SFTTrainer(transformers.Trainer)``. So the switch
installs trainwell's classes under the reference's names *before* the library is imported; the library then
subclasses trainwell's ``Trainer`` and ``TrainingArguments`` and its callbacks subclass trainwell's
``TrainerCallback``. Called after such an import it would leave the library on the reference, silently, so it
refuses instead and names the classes that already subclass the reference.

Only the names of the Trainer API are replaced (those in ``REPLACED``, in ``transformers`` and in the submodules
the reference defines them in); models, tokenizers, ``AutoModel`` and the rest of ``transformers`` stay as they
are. ``transformers`` itself must be installed (the libraries need it anyway); trainwell still never imports it
on its own.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

# reference submodule -> the names replaced there (each also replaced in the top-level ``transformers``)
REPLACED: dict[str, tuple[str, ...]] = {
    "transformers.trainer": ("Trainer",),
    "transformers.trainer_seq2seq": ("Seq2SeqTrainer",),
    "transformers.training_args": ("TrainingArguments",),
    "transformers.training_args_seq2seq": ("Seq2SeqTrainingArguments",),
    "transformers.trainer_callback": ("TrainerCallback", "TrainerState", "TrainerControl", "CallbackHandler",
                                      "DefaultFlowCallback", "ProgressCallback", "PrinterCallback",
                                      "EarlyStoppingCallback", "ExportableState"),
}

_INSTALLED: dict[str, Any] = {}  # "module:name" -> the reference's object it replaced (for uninstall)


def patch_transformers() -> None:
    """Install trainwell's Trainer API under ``transformers``' names, before importing TRL or a library like it.

    ::

        import trainwell
        trainwell.patch_transformers()     # first
        from trl import SFTConfig, SFTTrainer   # now built on trainwell

    Idempotent. Raises ``RuntimeError`` when a class outside ``transformers`` already subclasses the reference's
    ``Trainer``, ``TrainingArguments`` or ``TrainerCallback`` (the library was imported first).
    """
    if _INSTALLED:
        return
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "trainwell.patch_transformers() puts trainwell under libraries built on transformers' Trainer, and "
            "transformers is not installed: pip install transformers"
        ) from None
    _refuse_late_call()
    import trainwell

    for module_name, names in REPLACED.items():
        module = importlib.import_module(module_name)
        for name in names:
            # read from the submodule first: transformers' lazy top level would resolve the name from it
            original = getattr(module, name)
            for target in (module, transformers):
                _INSTALLED[f"{target.__name__}:{name}"] = original
                setattr(target, name, getattr(trainwell, name))


def unpatch_transformers() -> None:
    """Put the reference's classes back (for tests; classes built on trainwell meanwhile stay so)."""
    for key, original in _INSTALLED.items():
        module_name, name = key.split(":")
        setattr(sys.modules[module_name], name, original)
    _INSTALLED.clear()


def is_patched() -> bool:
    """Whether :func:`patch_transformers` is in effect."""
    return bool(_INSTALLED)


def _refuse_late_call() -> None:
    """A library that subclassed the reference already would stay on it: say which, and what to do."""
    late = []
    for module_name, name in (("transformers.trainer", "Trainer"), ("transformers.training_args", "TrainingArguments"),
                              ("transformers.trainer_callback", "TrainerCallback")):
        module = sys.modules.get(module_name)
        base = getattr(module, name, None) if module is not None else None
        if base is None:
            continue  # never imported: nothing can subclass it yet
        late += [f"{cls.__module__}.{cls.__qualname__}" for cls in _all_subclasses(base)
                 if not cls.__module__.startswith("transformers.")]
    if late:
        shown = ", ".join(sorted(late)[:5]) + (" ..." if len(late) > 5 else "")
        raise RuntimeError(
            f"trainwell.patch_transformers() was called after {shown} subclassed transformers' Trainer API: those "
            "classes stay on the reference. Call it first, before importing trl, sentence_transformers or any "
            "library built on transformers.Trainer (at the top of the script, right after `import trainwell`)."
        )


def _all_subclasses(cls: type) -> list[type]:
    found, todo = [], list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        found.append(sub)
        todo.extend(sub.__subclasses__())
    return found
