"""Reading untrusted grid YAML within a budget: size, expanded nodes (alias bombs), depth.

PyYAML shares one object per anchor, so a "billion laughs" document loads fast but every
later deep copy or validation walks the expanded tree (9 levels of 9 aliases: 9^9 nodes
and minutes of work). The composed node graph is measured first, each shared node counted
as often as it is reached, and a document over budget is refused before anything is built.

Numbers: YAML 1.1 (PyYAML) reads ``1e11`` (no dot) as a string; grids get the YAML 1.2
float syntax, so ``1e11``, ``2E-4`` and ``+3e5`` are numbers wherever they appear.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_BYTES = 1 << 20
MAX_NODES = 200_000
MAX_DEPTH = 64

_BRACKETS = re.compile(r"[\[\]{}]")
_FLOAT_12 = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class YamlBudgetError(ValueError):
    """A document that is too large, too deep or expands to too many nodes."""


class _GridLoader(yaml.SafeLoader):
    """SafeLoader plus YAML 1.2 exponent floats (``1e11``); SafeLoader itself is untouched."""

    yaml_implicit_resolvers = {
        key: list(value) for key, value in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


for _first in "-+0123456789.":
    _GridLoader.yaml_implicit_resolvers.setdefault(_first, []).insert(
        0, ("tag:yaml.org,2002:float", _FLOAT_12)
    )


def load_untrusted(text: str) -> Any:
    """Parse one YAML document, refusing it (YamlBudgetError) when it is over
    MAX_BYTES, nests deeper than MAX_DEPTH or expands to more than MAX_NODES nodes."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise YamlBudgetError(f"is larger than {MAX_BYTES // 1024} KiB; a grid is a few lines")
    _check_flow_depth(text)
    loader = _GridLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlBudgetError(f"nests deeper than {MAX_DEPTH} levels") from None
        if node is None:
            return None
        _check_budget(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_flow_depth(text: str) -> None:
    """Refuse deep ``[[[...`` / ``{{{...`` before parsing: PyYAML's scanner is quadratic in
    the flow depth (2,000 levels: seconds). Brackets inside quoted strings count too; a
    grid with 64 unclosed brackets in a string is not one to keep."""
    depth = 0
    for match in _BRACKETS.finditer(text):
        if match.group() in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise YamlBudgetError(f"nests deeper than {MAX_DEPTH} levels")
        else:
            depth = max(0, depth - 1)


def _check_budget(root: yaml.Node) -> None:
    """Count nodes as if every alias were expanded (memoised per shared node), iteratively
    so a deep document cannot exhaust the interpreter's stack."""
    sizes: dict[int, int] = {}
    depth_of: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        if depth > MAX_DEPTH:
            raise YamlBudgetError(f"nests deeper than {MAX_DEPTH} levels")
        key = id(node)
        if key in sizes and depth_of[key] >= depth:
            continue
        children = _children(node)
        if not children_done:
            stack.append((node, depth, True))
            stack.extend((child, depth + 1, False) for child in children)
            continue
        size = 1 + sum(sizes.get(id(child), 1) for child in children)
        if size > MAX_NODES:
            raise YamlBudgetError(
                f"expands to more than {MAX_NODES:,} nodes (anchors/aliases: *ref); "
                "write the grid out with fewer repeated references"
            )
        sizes[key] = size
        depth_of[key] = depth


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
