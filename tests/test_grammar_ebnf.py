"""The turn's EBNF keeps one copy of the JSON basic rules, and folding its gaps keeps the language
while leaving no whitespace rule that ends where the next token may begin."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import xgrammar as xgr
from support.corpus import bfcl_files, load_bfcl
from support.soundness import call_text, ground_truth_arguments, tool

from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.grammar.engines import ebnf as ebnf_module
from hermes_vllm.grammar.engines import xgrammar as xgrammar_engine
from hermes_vllm.grammar.engines.base import allocate_bitmask
from hermes_vllm.grammar.engines.ebnf import fold_gaps, merge_equal_rules, rename, split_rules
from hermes_vllm.grammar.engines.xgrammar import turn_ebnf


def _strings_tool(name: str, keys: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in keys}, "required": list(keys)}
    return tool(schema, name)


def test_rename_leaves_names_inside_literals_and_classes_alone() -> None:
    assert (
        rename('((a "b" [b] b{0, 1}) | (ab))', {"b": "t0_b", "a": "t0_a"})
        == '((t0_a "b" [b] t0_b{0, 1}) | (ab))'
    )


@pytest.mark.parametrize("bad", ["", "no rule here", 'junk\nroot ::= ("a")'])
def test_text_that_is_not_a_printed_grammar_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="printed form"):
        split_rules(bad)


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


ELEMENT = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z_]\w*(?:\{\d+, ?-?\d+\})?')

# The two ways xgrammar prints a gap: a repeated one-character rule, and an optional class.
GAPS = (
    'root ::= (("{" w{0, 1} "\\"a\\"" o ":" w{0, 1} b) | ("[" w{0, 2} "]" w{0, 1}))\n'
    "w ::= (([ \\t\\n\\r]))\n"
    'o ::= ("" | ([ \\n\\r\\t]))\n'
    'b ::= (("1") | ("2" w{0, 1} "}")) (=(w{0, 1} "x"))\n'
)


def test_gaps_fold_into_the_element_after_them_and_the_language_is_kept() -> None:
    folded = fold_gaps(GAPS)
    bodies = dict(split_rules(folded))
    assert bodies["root"] == '(("{" gap_6 gap_5 gap_4) | ("[" gap_7 w{0, 1}))'  # a gap at the end stays
    assert bodies["gap_5"] == '((":") | ([ \\t\\n\\r] ":"))'  # the optional class folds too
    assert bodies["gap_7"] == '(("]") | ([ \\t\\n\\r] "]") | ([ \\t\\n\\r] [ \\t\\n\\r] "]"))'
    assert bodies["b"].endswith('(=(w{0, 1} "x"))')  # lookaheads are left as they are
    for text in ('{"a":1', '{ "a" : 1', '{ "a"\n: \t1', '{"a":2 }', "[]", "[  ] ", "[ ]\n"):
        assert _accepts(folded, text) == _accepts(GAPS, text), text
    for text in ('{  "a":1', "[   ]", '{"a":2  }'):
        assert not _accepts(folded, text) and not _accepts(GAPS, text), text


def test_equal_folds_are_written_once_and_kept_rules_are_left_alone() -> None:
    ebnf = 'root ::= ((w{0, 1} ":" basic_x w{0, 1} ":"))\nw ::= (([ \\t\\n\\r]))\nbasic_x ::= (("," w{0, 1} ":"))\n'
    folded = split_rules(fold_gaps(ebnf, lambda name: name.startswith("basic_")))
    assert folded[0] == ("root", "((gap_3 basic_x gap_3))")
    assert ("basic_x", '(("," w{0, 1} ":"))') in folded


def test_a_string_joins_the_gap_after_it_and_what_follows() -> None:
    """Inside a string whose rule is followed by a gap's rule, xgrammar re-checks every token that
    closes the string at each fill (``benchmarks/README.md``): the string, the gap and the element
    after it become one rule, and the language is kept."""
    ebnf = (
        'root ::= (("{" w{0, 1} basic_string w{0, 1} "}") | ("[" basic_string o "," basic_string "]"))\n'
        "w ::= (([ \\t\\n\\r]))\n"
        'o ::= ("" | ([ \\n\\r\\t]))\n'
        'basic_string ::= (("\\"" [a-z]* "\\""))\n'
    )
    folded = fold_gaps(ebnf, lambda name: name.startswith("basic_"))
    bodies = dict(split_rules(folded))
    joined = {body: name for name, body in bodies.items()}
    closing = joined['((basic_string "}") | (basic_string [ \\t\\n\\r] "}"))']
    comma = joined['((basic_string ",") | (basic_string [ \\t\\n\\r] ","))']
    opening = joined[f"(({closing}) | ([ \\t\\n\\r] {closing}))"]
    assert bodies["root"] == f'(("{{" {opening}) | ("[" {comma} basic_string "]"))'
    for text in (
        '{"a"}',
        '{ "a" }',
        '{"a"\n}',
        '{  "a"}',
        '{"a"  }',
        '["a","b"]',
        '["a" ,"b"]',
        '["a"  ,"b"]',
    ):
        assert _accepts(folded, text) == _accepts(ebnf, text), text


EQUAL = (
    'root ::= ((a c "z") | (basic_k basic_m) | (e))\n'
    'a ::= (("x" b))\n'
    'b ::= (("y") | ("w"))\n'
    'c ::= (("x" d))\n'
    'd ::= (("y") | ("w"))\n'
    'e ::= (("x" f))\n'
    'f ::= (("y") | ("v"))\n'
    'basic_k ::= (("q"))\n'
    'basic_m ::= (("q"))\n'
)


def test_equal_rules_are_written_once_through_their_references() -> None:
    """``d`` equals ``b``, so ``c`` (``"x" d``) equals ``a``; ``f`` differs by one literal, and
    kept rules (xgrammar's basics) and ``root`` stay as they are."""
    merged = merge_equal_rules(EQUAL, lambda name: name.startswith("basic_"))
    assert split_rules(merged) == [
        ("root", '((a a "z") | (basic_k basic_m) | (e))'),
        ("a", '(("x" b))'),
        ("b", '(("y") | ("w"))'),
        ("e", '(("x" f))'),
        ("f", '(("y") | ("v"))'),
        ("basic_k", '(("q"))'),
        ("basic_m", '(("q"))'),
    ]
    for text in ("xyxwz", "xwxyz", "qq", "xv", "xy"):
        assert _accepts(merged, text) and _accepts(EQUAL, text), text
    for text in ("xvxyz", "xyxy", "q", "xw"):
        assert not _accepts(merged, text) and not _accepts(EQUAL, text), text


def _bfcl_tools_and_calls(count: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The first ``count`` distinct BFCL functions, and each ground-truth call among them in both
    key orders, with a broken copy of each (its first argument's value opened as an array)."""
    tools: dict[str, dict[str, Any]] = {}
    texts: list[str] = []
    for path in bfcl_files():
        for case in load_bfcl(path):
            for fn in case.tools:
                if len(tools) < count:
                    tools.setdefault(fn["name"], fn)
            for answer in case.ground_truth or []:
                for name, raw in answer.items():
                    if tools.get(name) in case.tools and len(texts) < 4 * count:
                        args = ground_truth_arguments(raw)
                        name_first = call_text(name, args, compact=False)
                        body = json.dumps({"arguments": args, "name": name}, ensure_ascii=False)
                        texts += [name_first, f"<tool_call>{body}</tool_call>"]
                        if args:
                            at = name_first.index('": ', name_first.index('"arguments": ') + 13)
                            texts.append(name_first[:at] + '": [' + name_first[at + 3 :])
    return list(tools.values()), [f"Sure. {t} Done." for t in texts]


def test_merging_equal_rules_keeps_every_mask_over_bfcl_tools(tokenizer_131k: Any) -> None:
    """The engine's grammar (gaps folded, strings joined, rules merged), the same grammar
    unmerged and xgrammar's own print of it (nothing folded) allow the same tokens at every
    position of BFCL's ground-truth calls, either key order, and of broken copies of them."""
    compiler = ToolGrammarCompiler(tokenizer_131k, coverage="lenient")
    tools, texts = _bfcl_tools_and_calls(60)
    spec = compiler.prepare(tools).spec
    merged = compiler.engine.compile(spec).compiled
    plain_compiler = xgr.GrammarCompiler(compiler.vocab.tokenizer_info, cache_enabled=False)
    plain = plain_compiler.compile_grammar(
        xgr.Grammar.from_ebnf(fold_gaps(turn_ebnf(spec), xgrammar_engine._is_basic))
    )
    printed = plain_compiler.compile_grammar(xgr.Grammar.from_ebnf(turn_ebnf(spec)))
    masks = allocate_bitmask(3, compiler.vocab.vocab_size)
    rejected = 0
    for text in texts:
        matchers = [xgr.GrammarMatcher(g) for g in (merged, plain, printed)]
        for token in tokenizer_131k.encode(text, add_special_tokens=False):
            for row, matcher in enumerate(matchers):
                matcher.fill_next_token_bitmask(masks, row)
            assert bool((masks[0] == masks[1]).all()) and bool((masks[0] == masks[2]).all()), text
            accepted = [m.accept_token(token) for m in matchers]
            assert accepted[0] == accepted[1] == accepted[2], text
            if not accepted[0]:
                rejected += 1
                break
    assert len(texts) > 60 and len(texts) / 4 < rejected < len(texts) / 2


def test_a_turn_grammar_keeps_no_gap_that_ends_its_rule(tokenizer_131k: Any) -> None:
    """Each such gap made xgrammar re-check ~75k tokens per compile: a third of a cold compile."""
    compiler = ToolGrammarCompiler(tokenizer_131k)
    for choice in ("auto", "required"):
        spec = compiler.prepare([_strings_tool("t0", "ab"), _strings_tool("t1", "c")], choice).spec
        ebnf = fold_gaps(turn_ebnf(spec), xgrammar_engine._is_basic)
        rules = split_rules(ebnf)
        gaps = ebnf_module._gap_references(rules, ebnf)
        for name, body in rules:
            if not name.startswith("basic_") and name not in gaps:
                assert not set(ELEMENT.findall(body)) & gaps.keys(), (choice, name, body)


def _accepts(ebnf: str, text: str) -> bool:
    return bool(xgr.testing._is_grammar_accept_string(xgr.Grammar.from_ebnf(ebnf), text))
