"""The house's import rules, read from the source: vLLM only where the engine is, and no circles.

Every import counts, the ones inside functions too: a lazy import only hides a circle from the
interpreter, not from a reader (``cli`` and ``demo`` once imported each other that way).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import hermes_vllm

PACKAGE = Path(hermes_vllm.__file__).parent
VLLM_USERS = {
    "hermes_vllm.processor",
    "hermes_vllm.parsers",
    "hermes_vllm.plugin",
    "hermes_vllm.testing",
    "hermes_vllm.vllm_api",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["hermes_vllm", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _component(module: str) -> str:
    """``hermes_vllm.grammar.compiler`` -> ``hermes_vllm.grammar``: the unit the data flow names."""
    return ".".join(module.split(".")[:2])


def _imports(path: Path, modules: dict[str, Path]) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                yield child if child in modules else node.module


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        for target in _imports(path, modules):
            if not target.startswith("hermes_vllm."):
                continue
            a, b = _component(module), _component(target)
            if a != b:
                edges.setdefault(a, set()).add(b)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle between components, or ``None``."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_no_import_circle_between_modules() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_cycle_finder_sees_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_vllm_is_imported_only_where_the_engine_is() -> None:
    modules = _modules()
    users = {
        _component(module)
        for module, path in modules.items()
        if any(t == "vllm" or t.startswith("vllm.") for t in _imports(path, modules))
    }
    assert users <= VLLM_USERS, sorted(users - VLLM_USERS)
    assert users, "no module imports vLLM: the reader is broken"
