"""``const`` / ``enum`` objects accept any key order: JSON object equality ignores order.

The JSON-Schema-Test-Suite's object ``const``/``enum`` instances are sent in every key order they
have (its "same object with different property order is valid" among them), on each engine the
server may use; then the bound: up to ``ANY_ORDER_KEYS`` keys every order, beyond it the declared
order only, and a value whose orders would multiply past the structure bound keeps its own order.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from support.corpus import load_suite_file, suite_files
from support.soundness import call_text, tool

from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.schema import ANY_ORDER_KEYS, normalize_tool

ENGINES = ("xgrammar", "llguidance")


def _orders(value: Any) -> list[Any]:
    """``value`` with its objects' keys in every order (nested objects too)."""
    if isinstance(value, dict):
        inner = [[(k, v) for v in _orders(value[k])] for k in value]
        out = []
        for choice in itertools.product(*inner):
            for order in itertools.permutations(choice):
                out.append(dict(order))
        return out
    if isinstance(value, list):
        return [list(items) for items in itertools.product(*map(_orders, value))]
    return [value]


def _accepts(compiler: ToolGrammarCompiler, params: Any, arguments: Any) -> bool:
    return compiler.compile([tool(params)]).matcher().accepts_text(call_text("check", arguments))


def _object_groups() -> list[Any]:
    groups = []
    for path in suite_files():
        if path.stem in ("const", "enum"):
            for group in load_suite_file(path):
                schema = group["schema"]
                members = [schema["const"]] if "const" in schema else schema.get("enum", [])
                if not any(isinstance(m, dict) for m in members):
                    continue  # key order of declared properties is our policy's, not equality's
                tests = [t for t in group["tests"] if isinstance(t["data"], dict) and len(t["data"]) > 1]
                if tests:
                    groups.append(pytest.param(group, tests, id=f"{path.stem}: {group['description']}"))
    return groups


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("group", "tests"), _object_groups())
def test_suite_objects_are_judged_in_every_key_order(
    tokenizer: Any, engine: str, group: dict[str, Any], tests: list[dict[str, Any]]
) -> None:
    compiler = ToolGrammarCompiler(tokenizer, engine=engine)
    schema = {"type": "object", **{k: v for k, v in group["schema"].items() if k != "$schema"}}
    for test in tests:
        for arguments in _orders(test["data"]):
            assert _accepts(compiler, schema, arguments) == test["valid"], (test["description"], arguments)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_object_of_the_bound_is_accepted_in_every_order_and_nothing_else(
    tokenizer: Any, engine: str
) -> None:
    compiler = ToolGrammarCompiler(tokenizer, engine=engine)
    value = {chr(ord("a") + i): i for i in range(ANY_ORDER_KEYS)}
    nested = {"outer": {"x": [1, {"y": True, "z": None}], "w": "s"}}
    params = {"type": "object", "properties": {"v": {"const": value}, "n": {"enum": [nested, 1]}}}
    for order in _orders(value):
        assert _accepts(compiler, params, {"v": order}), order
    for order in _orders(nested):
        assert _accepts(compiler, params, {"n": order}), order
    assert not _accepts(compiler, params, {"v": {**value, "extra": 0}})
    assert not _accepts(compiler, params, {"v": dict(list(value.items())[1:])})
    assert not _accepts(compiler, params, {"v": {**value, "a": 1}})


def test_beyond_the_bound_the_declared_order_is_kept(tokenizer: Any) -> None:
    compiler = ToolGrammarCompiler(tokenizer)
    value = {chr(ord("a") + i): i for i in range(ANY_ORDER_KEYS + 1)}
    params = {"type": "object", "properties": {"v": {"const": value}}}
    assert _accepts(compiler, params, {"v": value})
    assert not _accepts(compiler, params, {"v": dict(reversed(value.items()))})
    # Objects of the bound three levels deep: the orders of each level multiply (about 8,000
    # subschemas), past the structure bound, so the value keeps its declared order throughout.
    nested: Any = 0
    for _ in range(3):
        nested = {chr(ord("p") + i): nested for i in range(ANY_ORDER_KEYS)}
    deep = {"type": "object", "properties": {"v": {"const": nested}}}
    assert len(json.dumps(normalize_tool(tool(deep)).parameters)) < 10_000
    assert _accepts(compiler, deep, {"v": nested})
    assert not _accepts(compiler, deep, {"v": {**dict(reversed(nested.items()))}})
