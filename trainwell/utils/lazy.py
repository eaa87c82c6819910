"""Lazy re-exports for package ``__init__`` modules (PEP 562 ``__getattr__`` / ``__dir__``).

Owns the one implementation that ``trainwell``, ``trainwell.args`` and ``trainwell.optim`` share: a package
declares ``name -> owning module`` and gets back the two module-level hooks. A name is imported from its
owner on first access and then cached in the package's globals, so importing the package costs nothing and
the second lookup is a plain attribute read. Runs on ``import trainwell``, so it imports only ``importlib``
and ``sys`` (and ``typing``, which every package ``__init__`` here loads anyway).
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only (postponed): nothing more to import at run time
    from collections.abc import Callable, Iterable, Mapping


def lazy_exports(
    module_name: str, exports: Mapping[str, str], extra_dir: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Build ``(__getattr__, __dir__)`` for the package ``module_name`` from ``exports`` (name -> module).

    Call it from the package's own ``__init__`` (the package must already be in ``sys.modules``, which it is
    while its body runs) and bind the results to module-level ``__getattr__`` and ``__dir__``. An unknown name
    raises ``AttributeError("module '<module_name>' has no attribute '<name>'")``, the message Python gives
    for a plain module. ``__dir__`` lists the exported names plus ``extra_dir`` (e.g. submodules or
    ``__version__``), sorted.
    """
    namespace = sys.modules[module_name].__dict__
    listing = sorted(set(exports) | set(extra_dir))

    def __getattr__(name: str) -> Any:
        owner = exports.get(name)
        if owner is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(owner), name)
        namespace[name] = value  # cache: the next lookup is a plain module attribute, not this hook
        return value

    def __dir__() -> list[str]:
        return list(listing)

    return __getattr__, __dir__
