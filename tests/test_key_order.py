"""``HERMES_VLLM_CALL_KEY_ORDER=any``: a call's top-level arguments in any order, else declared.

The setting exists to measure what a forced order costs a model (benchmarks/quality.py); here
its bound: every order of a closed tool of up to ``ANY_ORDER_ARGUMENTS`` properties, optional
ones still optional, nothing else admitted; a bigger tool keeps its declared order.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from support.soundness import call_text, tool

from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.schema import normalize_tool
from hermes_vllm.schema.rewrite import ANY_ORDER_ARGUMENTS
from hermes_vllm.settings import Limits

PARAMS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
    "required": ["a", "b"],
}
ARGUMENTS = {"a": 1, "b": "x", "c": True}


def _accepts(compiler: ToolGrammarCompiler, params: Any, arguments: dict[str, Any]) -> bool:
    return compiler.compile([tool(params)]).matcher().accepts_text(call_text("check", arguments))


def test_any_order_admits_every_order_and_declared_only_its_own(tokenizer: Any) -> None:
    free = ToolGrammarCompiler(tokenizer, engine="xgrammar", limits=Limits(call_key_order="any"))
    forced = ToolGrammarCompiler(tokenizer, engine="xgrammar")
    for order in itertools.permutations(ARGUMENTS):
        arguments = {k: ARGUMENTS[k] for k in order}
        assert _accepts(free, PARAMS, arguments), order
        assert _accepts(forced, PARAMS, arguments) == (order == ("a", "b", "c")), order
    for order in itertools.permutations("ab"):  # the optional one left out
        assert _accepts(free, PARAMS, {k: ARGUMENTS[k] for k in order}), order
    assert not _accepts(free, PARAMS, {"c": True, "a": 1})  # a required one missing
    assert not _accepts(free, PARAMS, {"b": "x", "a": "1"})  # a wrong type in another order
    assert not _accepts(free, PARAMS, {"b": "x", "a": 1, "d": 2})  # still closed


def test_llguidance_takes_every_order_of_required_arguments(tokenizer: Any) -> None:
    """llguidance takes ``maxProperties`` only where every property is required (and refuses
    the rest with that reason, HTTP 400)."""
    free = ToolGrammarCompiler(tokenizer, engine="llguidance", limits=Limits(call_key_order="any"))
    params = {**PARAMS, "required": ["a", "b", "c"]}
    for order in itertools.permutations(ARGUMENTS):
        assert _accepts(free, params, {k: ARGUMENTS[k] for k in order}), order


def test_a_tool_past_the_bound_keeps_its_declared_order() -> None:
    names = [f"p{i}" for i in range(ANY_ORDER_ARGUMENTS + 1)]
    params = {"type": "object", "properties": {n: {"type": "integer"} for n in names}}
    spec = normalize_tool(tool(params), 0, Limits(call_key_order="any"))
    assert "anyOf" not in spec.parameters and list(spec.parameters["properties"]) == names
    small = normalize_tool(tool(PARAMS), 0, Limits(call_key_order="any"))
    assert len(small.parameters["anyOf"]) == 6


def test_an_unknown_key_order_is_refused() -> None:
    with pytest.raises(ValueError, match="HERMES_VLLM_CALL_KEY_ORDER"):
        normalize_tool(tool(PARAMS), 0, Limits(call_key_order="sorted"))
