"""The stack of trainwell's layers, written once, and a test that every import points down it.

Every ``import`` of a trainwell module, at module level or inside a function (``importlib.import_module`` of a
constant name too), goes to the same layer or a lower one. Imports under ``if TYPE_CHECKING:`` are annotations
only and never run, so they are not held to it; but they count for circles: no circle of imports, type-only ones
included, may leave its folder (two folders that name each other cannot be read, tested or replaced alone). A
lower layer that needs something of a higher one is handed it (a callable, an object), as
``backend.failures.stop_together`` is handed how to find the newest checkpoint.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trainwell"

# Low to high. A module belongs to the most specific entry that names it (a package or a module path).
STACK: list[tuple[str, list[str]]] = [
    ("utils", ["utils", "outputs"]),
    ("args", ["args", "training_args", "training_args_seq2seq"]),
    ("state and events", ["state", "events"]),
    ("data, optim, backend", ["data", "optim", "backend"]),
    ("checkpoint", ["checkpoint"]),
    ("loop", ["loop"]),
    # features the Trainer wires in: each is handed a trainer object and never imports the facade
    ("techniques, trackers, hub, report, search", ["techniques", "integrations", "report", "search"]),
    ("the Trainer facade", ["trainer", "hooks", "wiring", "checks", "trainer_seq2seq"]),
    # the reference's module paths and the package surfaces: they re-export from every layer
    ("compat surfaces", ["__init__", "integrations.__init__", "integrations.underneath", "trainer_utils",
                         "trainer_pt_utils", "trainer_callback", "optimization", "hf_argparser", "debug_utils",
                         "patch", "utils.notebook"]),
    ("cli", ["cli", "examples", "__main__"]),
]


def _layer(module: str) -> int | None:
    """The index in STACK of ``trainwell.<module>`` (dotted, relative to the package); None outside trainwell."""
    best: tuple[int, int] | None = None  # (specificity, layer)
    for index, (_, members) in enumerate(STACK):
        for member in members:
            if module == member or module.startswith(member + "."):
                specificity = member.count(".") + 1
                if best is None or specificity > best[0]:
                    best = (specificity, index)
    return None if best is None else best[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts[-1] = "__init__"  # a package's own file: "integrations.__init__"
    return ".".join(parts)


def _is_module(dotted: str) -> bool:
    base = PACKAGE.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _target(module: str, name: str | None = None) -> str | None:
    """The imported trainwell module, relative to the package ("" for trainwell itself); None if not trainwell."""
    if module != "trainwell" and not module.startswith("trainwell."):
        return None
    relative = module[len("trainwell."):] if module != "trainwell" else ""
    if name is not None:  # from package import submodule: the submodule is what runs
        candidate = f"{relative}.{name}" if relative else name
        if _is_module(candidate):
            return candidate
    if relative == "" or _is_module(relative) and (PACKAGE / relative.replace(".", "/") / "__init__.py").is_file():
        return f"{relative}.__init__" if relative else "__init__"
    return relative


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return skipped


def _imports(path: Path, type_only: bool = False):
    """The trainwell modules ``path`` imports (with ``type_only``, those under ``if TYPE_CHECKING:`` too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = set() if type_only else _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield node.lineno, _target(node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, _target(alias.name)
        elif (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, _target(node.args[0].value)


def _violations(path: Path, source: str) -> list[str]:
    """The imports of ``path`` (the module ``source``) that point up the stack."""
    mine = _layer(source)
    assert mine is not None, f"{source} is in no layer of STACK: add it"
    found = []
    for line, target in sorted(_imports(path), key=lambda item: item[0]):
        if target is None:
            continue
        theirs = _layer(target)
        assert theirs is not None, f"{source}:{line} imports {target}, which is in no layer of STACK"
        if theirs > mine:
            found.append(f"trainwell/{source.replace('.', '/')}.py:{line} ({STACK[mine][0]}) imports "
                         f"trainwell.{target} ({STACK[theirs][0]})")
    return found


def test_every_import_points_down_the_stack():
    found = [v for path in sorted(PACKAGE.rglob("*.py")) for v in _violations(path, _module_name(path))]
    assert found == []


def test_an_upward_import_is_found_wherever_it_runs(tmp_path):
    """The check can fail: a loop module importing the facade is caught at module level, inside a function and
    through importlib; the same import under TYPE_CHECKING (never run) is not."""
    module = tmp_path / "fake.py"
    module.write_text(
        "import importlib\n"
        "from typing import TYPE_CHECKING\n"
        "from trainwell.checks import short_repr\n"
        "if TYPE_CHECKING:\n"
        "    from trainwell.trainer import Trainer\n"
        "def later():\n"
        "    from trainwell import wiring\n"
        "    return importlib.import_module('trainwell.trainer')\n"
        "from trainwell.utils.errors import did_you_mean\n"
    )
    found = _violations(module, "loop.fake")
    assert [v.split(":")[1].split(" ")[0] for v in found] == ["3", "7", "8"], found
    assert "imports trainwell.checks (the Trainer facade)" in found[0]


def test_the_package_surfaces_are_above_what_they_re_export():
    assert _layer("__init__") > _layer("trainer") and _layer("integrations.__init__") > _layer("search")
    assert _layer("integrations.wandb") < _layer("trainer") and _layer("integrations.registry") < _layer("wiring")
    assert _target("trainwell.integrations", "hub") == "integrations.hub"
    assert _target("trainwell.integrations", "reporting_callbacks") == "integrations.__init__"
    assert _target("trainwell", "checks") == "checks" and _target("trainwell") == "__init__"


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other in a circle (strongly connected, more than one module)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm; the package is a few hundred modules deep at most
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def _import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the trainwell modules it imports, type-only imports included."""
    graph = {_module_name(path): {t for _, t in _imports(path, type_only=True) if t is not None}
             for path in package.rglob("*.py")}
    return {module: {t for t in targets if t in graph and t != module} for module, targets in graph.items()}


def _crossing_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    def folder(module: str) -> str:
        return module.rsplit(".", 1)[0] if "." in module else "<top level>"

    return [group for group in _circles(graph) if len({folder(m) for m in group}) > 1]


def test_no_circle_of_imports_leaves_its_folder():
    """Modules of one folder may lean on each other; a circle through two folders (or a folder and a top-level
    module) ties layers together, so that none can be read, tested or replaced alone. Type-only imports count:
    a protocol of the facade named by a lower folder that the facade names back is such a tie."""
    assert _crossing_circles(_import_graph()) == []


def test_a_circle_of_type_only_imports_is_found(tmp_path, monkeypatch):
    """The check can fail on annotations alone: a checkpoint module naming the facade's protocol, which names the
    checkpointer back, both under TYPE_CHECKING."""
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "__init__.py").write_text("")
    (tmp_path / "checkpoint" / "saver.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainwell.hooks import TrainerHooks\n")
    (tmp_path / "hooks.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainwell.checkpoint.saver import Saver\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert _crossing_circles(_import_graph(tmp_path)) == [["checkpoint.saver", "hooks"]]


def test_a_circle_is_found():
    graph = {"a.x": {"b.y"}, "b.y": {"a.x", "c"}, "c": set(), "d.p": {"d.q"}, "d.q": {"d.p"}}
    assert sorted(_circles(graph)) == [["a.x", "b.y"], ["d.p", "d.q"]]
