"""Hostile or broken tool definitions: each is refused with a message naming the problem, or
compiles within a bounded time; none crashes or hangs the compiler.

These run the frontend's admission check (what becomes HTTP 400) and, where it passes, the real
compile on the 32k tokenizer.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from hermes_vllm import constraint_args
from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.memo import CHARS, MAX_CHARS, clear_memos, memoize_small
from hermes_vllm.processor.core import validate_request
from hermes_vllm.settings import Limits


def tool(params: Any, name: str = "t") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params}}


def nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


REFUSED: list[tuple[str, Any, str]] = [
    ("tools not a list", {"hermes_vllm": json.dumps({"v": 1, "tools": {"a": 1}})}, "expected a list"),
    ("tool not an object", constraint_args(["get_weather"]), "tools[0]: expected an object"),
    ("parameters not JSON", constraint_args([tool("{oops")]), "parameters: not valid JSON"),
    ("parameters not an object", constraint_args([tool(["a"])]), "expected a JSON Schema object"),
    (
        "invalid JSON Schema",
        constraint_args([tool({"type": "object", "properties": {"a": {"type": 5}}})]),
        "not a valid JSON Schema",
    ),
    (
        "unknown $ref",
        constraint_args([tool({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})]),
        "does not resolve",
    ),
    (
        "remote $ref",
        constraint_args([tool({"type": "object", "properties": {"a": {"$ref": "https://x/y.json"}}})]),
        "only local references",
    ),
    ("50-level nesting", constraint_args([tool(nested(50))]), "nesting deeper than"),
    (
        "2,000 tools",
        constraint_args([tool({"type": "object"}, f"t{i}") for i in range(2000)]),
        "2000 tools exceed the limit",
    ),
    (
        "1 MB schema",
        constraint_args([tool({"type": "object", "description": "x" * (1 << 20)})]),
        "bytes of schema exceed",
    ),
    (
        "pattern not a regex",
        constraint_args([tool({"type": "object", "properties": {"a": {"type": "string", "pattern": "(["}}})]),
        "is not a 'regex'",
    ),
    (
        "maxLength 10**9",
        constraint_args(
            [tool({"type": "object", "properties": {"a": {"type": "string", "maxLength": 10**9}}})]
        ),
        "exceeds the limit",
    ),
    (
        "enum of 100,000",  # ~590 KB as JSON: refused by size before it is read
        constraint_args([tool({"type": "object", "properties": {"a": {"enum": list(range(100_000))}}})]),
        "bytes of schema exceed",
    ),
    (
        "enum of 5,000",
        constraint_args([tool({"type": "object", "properties": {"a": {"enum": list(range(5_000))}}})]),
        "5000 values exceed",
    ),
    ("empty name", constraint_args([tool({"type": "object"}, "")]), "a non-empty string is required"),
    (
        "300-char name",
        constraint_args([tool({"type": "object"}, "n" * 300)]),
        "300 characters exceed the limit",
    ),
    (
        "duplicate names",
        constraint_args([tool({"type": "object"}, "a"), tool({"type": "object"}, "a")]),
        "defined more than once",
    ),
    (
        "arguments not an object",
        constraint_args([tool({"type": "string"})]),
        "the arguments of a call are a JSON object",
    ),
]


@pytest.mark.parametrize(("case", "extra", "needle"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_with_a_message_naming_the_problem(case: str, extra: dict[str, Any], needle: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ValueError) as err:
        validate_request(extra, "xgrammar")
    assert needle in str(err.value), str(err.value)
    assert time.perf_counter() - start < 5, f"{case}: admission must stay cheap"


BOUNDED: list[tuple[str, Any]] = [
    ("recursive $ref", {"type": "object", "properties": {"node": {"$ref": "#/$defs/n"}},
                        "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}, "v": {"type": "integer"}}}}}),
    ("root recursion", {"type": "object", "properties": {"child": {"$ref": "#"}, "v": {"type": "integer"}}}),
    ("catastrophic pattern", {"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}),
    ("large enum at the limit", {"type": "object", "properties": {"a": {"enum": [f"v{i}" for i in range(4096)]}}}),
    ("maxLength at the limit", {"type": "object", "properties": {"a": {"type": "string", "maxLength": 100_000}}}),
    ("32-level nesting", nested(31)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "params"), BOUNDED, ids=[c[0] for c in BOUNDED])
def test_compiles_within_bounded_time(case: str, params: Any, tokenizer: Any) -> None:
    compiler = ToolGrammarCompiler(tokenizer, engine="auto")  # what the server uses
    validate_request(constraint_args([tool(params)]), "auto")
    start = time.perf_counter()
    grammar = compiler.compile([tool(params)])
    elapsed = time.perf_counter() - start
    assert elapsed < 5, f"{case} took {elapsed:.1f} s"
    assert grammar.memory_bytes < 64 << 20


def test_limits_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_vllm import settings

    monkeypatch.setenv("HERMES_VLLM_MAX_TOOLS", "3")
    monkeypatch.setenv("HERMES_VLLM_COMPILE_TIMEOUT_S", "2.5")
    settings.get_limits.cache_clear()
    try:
        limits = settings.get_limits()
        assert limits.max_tools == 3 and limits.compile_timeout_s == 2.5
        assert limits.cache_bytes == Limits().cache_bytes
        monkeypatch.setenv("HERMES_VLLM_MAX_TOOLS", "many")
        settings.get_limits.cache_clear()
        with pytest.raises(ValueError, match="HERMES_VLLM_MAX_TOOLS"):
            settings.get_limits()
    finally:
        monkeypatch.delenv("HERMES_VLLM_MAX_TOOLS")
        monkeypatch.delenv("HERMES_VLLM_COMPILE_TIMEOUT_S")
        settings.get_limits.cache_clear()


def test_request_memos_never_hold_maximum_size_inputs() -> None:
    """A client sending many maximum-size schemas cannot fill the per-request memos with them:
    each memo keeps inputs up to a total length, and never the longest; an agent's hundreds of
    tools, each checked by itself, all stay cached (an entry-counted LRU missed every time)."""
    seen: list[str] = []

    @memoize_small(len)
    def check(text: str) -> int:
        seen.append(text)
        return len(text)

    tools = [f"tool {i}" for i in range(400)]
    large, huge = "y" * (MAX_CHARS // 2), "z" * (MAX_CHARS + 1)
    for text in (*tools, *tools, large, large, huge, huge):
        assert check(text) == len(text)
    assert seen == [*tools, large, huge, huge]
    others = [str(i) * (MAX_CHARS // 2) for i in range(2 * CHARS // MAX_CHARS + 1)]
    for text in others:  # more than CHARS in all: the oldest are dropped
        check(text)
    seen.clear()
    check(others[-1])
    check(large)
    assert seen == [large]
    check.cache_clear()  # a benchmark's first request again
    check(others[-1])
    assert seen == [large, others[-1]]
    clear_memos()  # every memo's maker empties them all, this one too
    check(others[-1])
    assert seen == [large, others[-1], others[-1]]
