"""Reading YAML with its aliases bounded before anything expands them: what config files go through.

YAML's anchors and aliases (``&a`` ... ``*a``) let a few hundred bytes stand for billions of values ("billion
laughs": nine levels of nine aliases each). PyYAML builds such a document cheaply, sharing one object per
anchor, but anything that walks it afterwards (a JSON round trip, a deep copy, printing) expands every alias: a
454-byte config took 8 GB and 77 s to be refused that way. A self-referencing alias (``a: &x [*x]``) builds a
circular structure that the same walk can only report as "Circular reference detected".

``load_yaml`` therefore composes the document into PyYAML's node graph (aliases are shared nodes there,
nothing is expanded), counts the values the document holds once every alias is expanded, each shared node
counted once and its count reused (linear in the size of the graph), and refuses past ``MAX_VALUES`` or at a
cycle, naming the source and the key, before one Python object is built. Then it builds the data with PyYAML's
safe constructor. Needs PyYAML (imported when called).
"""

from __future__ import annotations

from typing import Any

MAX_VALUES = 100_000  # values (mappings, lists, scalars and keys) once aliases are expanded; a config has hundreds


class YamlError(ValueError):
    """A YAML document that cannot be read safely: the message names the source and the key."""


def load_yaml(text: str, source: str, max_values: int = MAX_VALUES) -> Any:
    """The data of the one YAML document in ``text`` (None when empty), built with PyYAML's safe constructor.

    ``source`` (a file name, or a description such as "the value of --model") starts every error message.
    Raises ``YamlError`` when the document holds a circular alias or more than ``max_values`` values once its
    aliases are expanded, and PyYAML's own ``yaml.YAMLError`` when it is not valid YAML.
    """
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node, source, max_values)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _children(node: Any, path: str) -> list[tuple[Any, str]]:
    """The child nodes of ``node`` with the key path of each (``a.b``, ``a[2]``; a key node is its own key)."""
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return [(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
    if isinstance(node, yaml.MappingNode):
        out = []
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else "<key>"
            child = f"{path}.{name}" if path else str(name)
            out += [(key, child), (value, child)]
        return out
    return []


def expanded_size(root: Any, source: str, max_values: int = MAX_VALUES) -> int:
    """The number of values the node graph ``root`` stands for with every alias expanded; ``YamlError`` at a
    cycle or past ``max_values``. Iterative (a deep document needs no deep Python stack) and linear in the
    graph: each node's count is computed once and added wherever the node is referenced again."""
    done: dict[int, int] = {}
    on_path: dict[int, str] = {id(root): ""}
    stack: list[list[Any]] = [[root, "", iter(_children(root, "")), 1]]  # node, path, children left, count
    while stack:
        frame = stack[-1]
        child, path = next(frame[2], (None, ""))
        if child is None:
            stack.pop()
            del on_path[id(frame[0])]
            done[id(frame[0])] = frame[3]
            if stack:
                stack[-1][3] += frame[3]
                _check_count(stack[-1][3], source, stack[-1][1], max_values)
            continue
        if id(child) in done:
            frame[3] += done[id(child)]
            _check_count(frame[3], source, frame[1], max_values)
        elif id(child) in on_path:
            raise _circular(source, path, on_path[id(child)], child)
        else:
            on_path[id(child)] = path
            stack.append([child, path, iter(_children(child, path)), 1])
    return done[id(root)]


def _check_count(count: int, source: str, path: str, max_values: int) -> None:
    if count > max_values:
        where = f" under {path!r}" if path else ""
        raise YamlError(
            f"{source}: its aliases (*name) expand to more than {max_values:,} values{where}: a config "
            "never needs that many, and expanding them would take gigabytes (a 'billion laughs' "
            "document). Write the values out, or use fewer nested aliases."
        )


def _circular(source: str, path: str, target: str, node: Any) -> YamlError:
    line = getattr(getattr(node, "start_mark", None), "line", None)
    anchor = f"the value of {target!r}" if target else "the whole document"
    at = f" (line {line + 1})" if line is not None else ""
    return YamlError(
        f"{source}: the alias at {path!r} refers to {anchor}{at}, which contains it: a circular "
        "reference, which a config cannot hold. Write the value out instead of the alias."
    )


__all__ = ["MAX_VALUES", "YamlError", "expanded_size", "load_yaml"]
