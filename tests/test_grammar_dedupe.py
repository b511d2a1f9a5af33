"""Merging equal EBNF rules keeps the grammar's language and stores each JSON basic rule once."""

from __future__ import annotations

import json
from typing import Any

import pytest
import xgrammar as xgr

from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.grammar.engines.ebnf_dedupe import dedupe_rules
from hermes_vllm.testing.soundness import tool


def _strings_tool(name: str, keys: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in keys}, "required": list(keys)}
    return tool(schema, name)


def test_equal_rules_merge_and_references_follow() -> None:
    ebnf = (
        'root ::= ((a "x" b) | (c))\n'
        'a ::= (("q" a) | ("a"))\n'
        'b ::= (("q" b) | ("a"))\n'
        'c ::= (("a" "b" "[a]"))\n'
    )
    merged = dedupe_rules(ebnf, "root")
    assert merged.splitlines() == [
        'root ::= ((a "x" a) | (c))',
        'a ::= (("q" a) | ("a"))',
        'c ::= (("a" "b" "[a]"))',
    ]
    for text in ("qaxa", "axqqa", "ab[a]"):
        assert _accepts(merged, text) == _accepts(ebnf, text)


def test_rules_that_differ_deep_down_stay_apart() -> None:
    ebnf = 'root ::= ((a b))\na ::= (("x" c))\nb ::= (("x" d))\nc ::= (("1"))\nd ::= (("2"))\n'
    assert dedupe_rules(ebnf, "root") == ebnf


def test_only_mergeable_rules_merge() -> None:
    ebnf = 'root ::= ((a b c d))\na ::= (("x"))\nb ::= (("x"))\nc ::= (("y"))\nd ::= (("y"))\n'
    merged = dedupe_rules(ebnf, "root", lambda name: name in "ab")
    assert merged == 'root ::= ((a a c d))\na ::= (("x"))\nc ::= (("y"))\nd ::= (("y"))\n'


def test_names_inside_literals_and_classes_are_not_renamed() -> None:
    ebnf = 'root ::= ((a "b" [b] b))\na ::= (("b"))\nb ::= (("b"))\n'
    assert dedupe_rules(ebnf, "root") == 'root ::= ((a "b" [b] a))\na ::= (("b"))\n'


@pytest.mark.parametrize("bad", ["", "no rule here", 'junk\nroot ::= ("a")'])
def test_text_that_is_not_a_printed_grammar_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="printed form"):
        dedupe_rules(bad, "root")


def test_many_tools_share_one_copy_of_the_json_basics(tokenizer_131k: Any) -> None:
    """Before merging, each tool's string rules cost ~370 KiB of masks: 12 tools took ~4.5 MiB."""
    compiler = ToolGrammarCompiler(tokenizer_131k)
    one = compiler.compile([_strings_tool("t0", "ab")]).memory_bytes
    many = compiler.compile([_strings_tool(f"t{i}", "abc"[: 1 + i % 3]) for i in range(12)])
    assert many.memory_bytes < 2 * one
    call = '<tool_call>{"name": "t7", "arguments": {"a": "x", "b": "y"}}</tool_call>'
    assert many.matcher().accepts_text(call)
    assert not many.matcher().accepts_text(call.replace('"y"', "7"))
    assert not many.matcher().accepts_text(call.replace('"t7"', json.dumps("t9")))


def _accepts(ebnf: str, text: str) -> bool:
    return bool(xgr.testing._is_grammar_accept_string(xgr.Grammar.from_ebnf(ebnf), text))
