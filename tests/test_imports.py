"""The house's import rules, read from the source: vLLM only where the engine is, the budget free of
grammars and engines, and no circles.

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
ENGINE_LIBRARIES = {"xgrammar", "llguidance", "outlines_core", "torch", "vllm"}
"""What a room that says it is engine-free may not reach (torch comes with every engine)."""


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


def _reached(starts: set[str], modules: dict[str, Path]) -> set[str]:
    """Every module of the package that importing ``starts`` may run, lazy imports included (a
    module's packages run before it: ``hermes_vllm.budget.speller`` runs ``budget/__init__``)."""
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in seen or module not in modules:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += [t for t in _imports(modules[module], modules) if t.startswith("hermes_vllm")]
    return seen


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


def test_no_import_circle_between_any_modules() -> None:
    """Every module of the package against every other, inside packages too (seven processor
    modules once imported each other in a loop, the core's builder reaching up to the V2 adapter
    for the frontend's view of the served model)."""
    modules = _modules()
    edges = {
        m: {t for t in _imports(path, modules) if t in modules and t != m} for m, path in modules.items()
    }
    cycle = _cycle(edges)
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


def test_budget_reaches_no_grammar_and_no_engine() -> None:
    """``budget/`` says it is engine-free: nothing it imports, at any depth, is a grammar module or
    imports an engine library (a budget module once imported ``grammar.compiler`` for one helper,
    and torch and xgrammar came with it)."""
    modules = _modules()
    reached = _reached({m for m in modules if _component(m) == "hermes_vllm.budget"}, modules)
    grammar = sorted(m for m in reached if _component(m) == "hermes_vllm.grammar")
    engines = sorted(
        f"{m} imports {t}"
        for m in reached
        for t in _imports(modules[m], modules)
        if t.split(".")[0] in ENGINE_LIBRARIES
    )
    assert not grammar and not engines, (grammar, engines)
    assert "hermes_vllm.spans" in reached, "the budget reads tags through spans: the reader is broken"
