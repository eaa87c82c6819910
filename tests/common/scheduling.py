"""Which tests may run side by side (pytest-xdist) and which need the machine to themselves.

``scripts/test.sh`` runs the suite on pytest-xdist workers (``-n``, ``--dist loadgroup``), one more than the cores:
the ``serial`` tests form one group that one worker runs first, one at a time (never two side by side), while the
other workers, at a lower priority, run the rest on what the chain leaves of the cores. A test is ``serial`` when

- it is marked ``serial`` or ``distributed`` (``pytest.mark.serial``: "run me alone"), or
- the code it runs launches several processes, binds a port or starts Ray: found by following the test function,
  its fixtures, and the functions and classes of the ``tests`` package they name, and looking for a launcher
  (``torch.distributed.run``, ``accelerate launch``, ``ray``, ``init_process_group``, ``spawn``, a socket's
  ``bind``, the harnesses of ``tests/common/launch.py`` and ``tests/common/multinode.py``).

Two launchers at once would fight over the default rendezvous port (29500) and over the 2 cores, and a Ray started
by one test can be joined by another's ``ray.init()``; and these tests time what their processes do (a watchdog, a
collective's timeout), which the others' lower priority keeps from starving. ``pytest.mark.parallel_safe``
overrides the automatic rule for a test it misjudges (never a marker: an explicit ``serial`` wins). It errs towards
running alone: a local variable named ``launch`` or ``ray`` in a function with an ``assert`` counts (pytest's
assertion rewriting stores the names of locals as string constants).

A test that uses a module-, class- or package-scoped fixture is put in an ``xdist_group`` with the rest of its
module, so the fixture is built once, on one worker, rather than once per worker.
"""

from __future__ import annotations

import inspect
import os
import re
import types
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent.parent
# String constants that start several processes (a launcher's module, command or option: a whole constant, so prose
# naming torchrun is not one; pytest's assertion rewriting adds the names of local variables as constants), and names
# (globals, attributes, imports) that do or bind a port.
LAUNCHER_STRINGS = re.compile(r"^(torch\.distributed\.run|launch|--nproc[-_]per[-_]node|--num[-_]processes|--nnodes"
                              r"|ray(\.\w+)*)$")
LAUNCHER_NAMES = frozenset({"init_process_group", "spawn", "start_processes", "bind", "ray", "free_port",
                            "launch_two_nodes", "ScriptRuns"})  # fmt: skip
SHARED_SCOPES = frozenset({"module", "class", "package"})


def _in_tests(obj: Any) -> bool:
    try:
        return Path(inspect.getfile(obj)).resolve().is_relative_to(TESTS)
    except (TypeError, OSError):
        return False


class LauncherFinder:
    """Whether a function, followed through what it names in the ``tests`` package, starts a launcher."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Any, bool]] = {}  # id -> (the object, kept alive so its id is not reused; answer)

    def launches(self, obj: Any) -> bool:
        key = id(obj)
        if key not in self._seen:
            self._seen[key] = (obj, False)  # cycles: a function reached again adds nothing
            self._seen[key] = (obj, any(self._code_launches(code, globs) for code, globs in self._codes(obj)))
        return self._seen[key][1]

    def _codes(self, obj: Any) -> list[tuple[types.CodeType, dict]]:
        obj = inspect.unwrap(obj) if callable(obj) else obj
        if isinstance(obj, (types.FunctionType, types.MethodType)):
            function = getattr(obj, "__func__", obj)
            return [(function.__code__, function.__globals__)]
        if isinstance(obj, type) and _in_tests(obj):
            return [pair for member in vars(obj).values() if isinstance(member, types.FunctionType)
                    for pair in self._codes(member)]  # fmt: skip
        return []

    def _code_launches(self, code: types.CodeType, globs: dict) -> bool:
        if LAUNCHER_NAMES.intersection(code.co_names):
            return True
        consts = list(code.co_consts)
        for const in consts:
            if isinstance(const, (tuple, frozenset)):  # a list or set literal of constants is compiled to one
                consts.extend(const)
            elif isinstance(const, str) and LAUNCHER_STRINGS.match(const):
                return True
            elif isinstance(const, types.CodeType) and self._code_launches(const, globs):
                return True
        for name in code.co_names:
            value = globs.get(name)
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(_in_tests(v) and self.launches(v) for v in values if callable(v)):
                return True
        return False


def _fixture_functions(item: pytest.Item) -> list[tuple[Any, str]]:
    """(function, scope) of each fixture the test uses that the tests package defines."""
    info = getattr(item, "_fixtureinfo", None)
    found = []
    for defs in (info.name2fixturedefs.values() if info else ()):
        for fixturedef in defs:
            if _in_tests(fixturedef.func):
                found.append((fixturedef.func, fixturedef.scope))
    return found


#: the xdist group of the ``serial`` tests: one worker runs them one after another, beside the other workers
SERIAL_GROUP = "serial"


def schedule(items: list[pytest.Item], distributed: bool = False) -> None:
    """Mark each item ``serial`` or not, and group the ones sharing a module-scoped fixture (see the docstring).

    ``distributed``: the run is spread over pytest-xdist workers: the ``serial`` tests then form one group, which one
    worker runs one at a time while the others run the rest. ``items`` are ordered longest units first: the serial
    chain (the run's critical path), then the other groups, then the single tests, which even out the end."""
    finder = LauncherFinder()
    for item in items:
        fixtures = _fixture_functions(item)
        explicit = item.get_closest_marker("serial") or item.get_closest_marker("distributed")
        if not explicit and not item.get_closest_marker("parallel_safe"):
            function = getattr(item, "function", None)
            if any(finder.launches(f) for f in [function, *(f for f, _ in fixtures)] if f is not None):
                item.add_marker(pytest.mark.serial)
        elif explicit and not item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.serial)
        if distributed and item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))
        elif any(scope in SHARED_SCOPES for _, scope in fixtures):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if distributed:  # the serial chain, then the groups (long units), then the rest, which fills in at the end;
        # a stable sort: every worker collects the same order, each module's tests stay together
        items.sort(key=lambda item: (item.get_closest_marker("serial") is None,
                                     item.get_closest_marker("xdist_group") is None))


#: the priority of a worker that is not running the serial chain: the lowest, as Ray runs its own workers at nice 15
#: (its worker_niceness): at 10 the side workers took the cores from the Ray tests' training processes (+40% wall)
SIDE_NICENESS = 19
_FIRST_ITEM_SEEN: list[bool] = []


def yield_to_the_serial_chain(item: pytest.Item) -> None:
    """At an xdist worker's first test: a worker that does not start with the ``serial`` chain lowers its priority
    (``os.nice``; the processes its tests start inherit it). The chain is the run's critical path and its tests time
    what their processes do (a watchdog, a collective's timeout); the others only fill the cores it leaves idle."""
    if _FIRST_ITEM_SEEN or "PYTEST_XDIST_WORKER" not in os.environ:
        return
    _FIRST_ITEM_SEEN.append(True)
    if not item.get_closest_marker("serial"):
        os.nice(SIDE_NICENESS)
