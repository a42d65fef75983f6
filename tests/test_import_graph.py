"""ms-port's modules import one another without a cycle, lazy imports included.

A cycle hidden inside a function (``from .render import render`` in a method) still ties
the modules together: each can only be understood, tested and moved with the others. Only
imports under ``if TYPE_CHECKING:`` (annotations) are left out. Late binding by name
(``FORWARD = "module"``, ``BLOCKS = "module:function"``) is the way for a light module to
name a heavy one that imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ms_port

ROOT = Path(ms_port.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("ms_port", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The ms-port modules ``name`` imports, wherever the import statement sits."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            candidates = [module, *(f"{module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        out.update(c for c in candidates if c in known and c != name)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, as a path that comes back to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_module_imports_itself_back():
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    assert sum(len(v) for v in graph.values()) > 100  # the graph was read at all
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_check_finds_a_cycle_where_there_is_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
