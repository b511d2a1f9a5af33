"""Every engine backend accepts the same turn language, on real tokenizations.

One table of turns (modes, parallel calls, dialects, key orders, opaque reasoning spans, an
unclosed span at the end, bounded whitespace, a closing tag inside a JSON string) must get the
table's verdict from xgrammar, llguidance and outlines-core alike; then token boundaries fed by
hand (a tag spelled over many tokens, one token holding a tag's end and the JSON's start), the
matcher protocol (masks agree with acceptance, stop tokens, rollback) and each engine's keyword
coverage. outlines-core compiles slowly, so the table runs on the 32k tokenizer and every
grammar is compiled once (the shared cache).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import astuple
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.soundness import tool

from hermes_vllm.gate import GATE_ROLLBACK
from hermes_vllm.grammar import ToolGrammarCompiler, ToolSchemaError
from hermes_vllm.grammar.compiler import GrammarCompileError
from hermes_vllm.grammar.engines import ENGINES, get_engine_class
from hermes_vllm.grammar.engines.base import allocate_bitmask
from hermes_vllm.grammar.engines.composed import sorted_vocabulary
from hermes_vllm.grammar.engines.outlines import END, MAX_ITEMS_BOUND, OutlinesEngine, avoiding
from hermes_vllm.grammar.turn import turn_shape, turn_spec
from hermes_vllm.schema import CONSTRAINING, normalize_tools
from hermes_vllm.settings import Limits

ENGINE_NAMES = tuple(ENGINES)
GET = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}},
    "required": ["a"],
}
PUT = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
TOOLS = [tool(GET, "get"), tool(PUT, "put")]
NAMED = {"type": "function", "function": {"name": "put"}}

_COMPILERS: dict[tuple[str, str], ToolGrammarCompiler] = {}


def compiler_for(engine: str, tokenizer: Any) -> ToolGrammarCompiler:
    """One compiler per (engine, tokenizer) for the whole module: building a vocabulary is slow."""
    key = (engine, tokenizer.name_or_path)
    if key not in _COMPILERS:
        _COMPILERS[key] = ToolGrammarCompiler(tokenizer, engine=engine)
    return _COMPILERS[key]


def hermes(name: str, args: str, order: str = "name_first") -> str:
    if order == "name_first":
        return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'
    return f'<tool_call>{{"arguments": {args}, "name": "{name}"}}</tool_call>'


GET_CALL = hermes("get", '{"a": 1}')
PUT_CALL = hermes("put", '{"x": "y"}')
BRACKET_CALL = '[tool_call]{"name": "get", "arguments": {"a": 1}}[/tool_call]'

# (dialect, tool_choice, parallel) -> [(text, verdict)]; the verdicts are xgrammar's language.
TABLE: dict[tuple[str, str, bool], list[tuple[str, bool]]] = {
    ("hermes", "auto", True): [
        ("", True),
        ("Just text, no call.", True),
        (GET_CALL, True),
        (hermes("get", '{"a": 1}', "arguments_first"), True),
        (f"Sure.\n{GET_CALL}\nand\n{PUT_CALL} done", True),
        (hermes("nope", "{}"), False),
        (hermes("get", '{"x": "y"}'), False),
        (hermes("get", "{}"), False),
        (hermes("get", '{"a": 1, "zzz": 2}'), False),
        (hermes("get", '{"a": "1"}'), False),
        ('<tool_call>{"name": "get", "arguments": {"a": 1}}', False),
        ("text <tool_call>", False),
        ("text ends inside a tag <tool_ca", True),
        ("stray </tool_call> and </think> are text", True),
        (f"<think>maybe {GET_CALL[:20]} no</think>{GET_CALL}", True),
        ("<think>an opaque <tool_call> {not json</think> then text", True),
        ("<think>unclosed at the end <tool_call>", True),
        ("<think>closed</think><think>unclosed", True),
        (hermes("put", '{"x": "</tool_call>"}'), True),
        (hermes("put", '{"x": "</tool_call>"}') + "</tool_call>", True),
        (hermes("put", '{"x": "<tool_call>"}') + " tail", True),
        ('<tool_call> {"name": "get", "arguments": {"a": 1}} </tool_call>', True),
        ('<tool_call>\n{"name": "get", "arguments": {"a": 1}}\n</tool_call>', True),
        ('<tool_call>  {"name": "get", "arguments": {"a": 1}}</tool_call>', False),
        ('<tool_call>{"name" : "get" , "arguments" :\n{"a": 1}\t}</tool_call>', True),
        ('<tool_call>{"name"  : "get", "arguments": {"a": 1}}</tool_call>', False),
        ('<tool_call>\n{"name": "get", "arguments": {"a" : 1 ,\n"b":["c",\t"d"]}}\n</tool_call>', True),
        ('<tool_call>{"name": "get", "arguments": {"a":  1}}</tool_call>', False),
        ('<tool_call>{"name": "get", "arguments": {"a": 1,\n  "b": []}}</tool_call>', False),
    ],
    ("hermes", "auto", False): [
        (f"a{GET_CALL}b", True),
        (f"{GET_CALL}{PUT_CALL}", False),
        (f"<think>x</think>{GET_CALL}<think>y</think>z<think>w", True),
        (f"{GET_CALL}<think>{PUT_CALL}</think>", True),
    ],
    ("hermes", "required", True): [
        ("no call at all", False),
        ("<think>only thinking</think>", False),
        (GET_CALL, True),
        (f" \n<think>plan {PUT_CALL}</think>\n{GET_CALL}", True),
        (f"text first {GET_CALL}", False),
        (f"{GET_CALL} then text {PUT_CALL}<think>", True),
    ],
    ("hermes", "required", False): [
        (f"{GET_CALL}{PUT_CALL}", False),
        (f"{GET_CALL} then text", True),
    ],
    ("hermes", "named", False): [
        (GET_CALL, False),
        (PUT_CALL, True),
        (f"<think>r</think>{PUT_CALL}", True),
        (f"{PUT_CALL}{PUT_CALL}", False),
    ],
    ("hermes", "none", True): [
        ("plain text", True),
        (GET_CALL, False),
        (f"<think>{GET_CALL}</think> answer", True),
        ("<think>unclosed <tool_call>", True),
    ],
    ("qwen", "auto", True): [
        (GET_CALL, True),
        (hermes("get", '{"a": 1}', "arguments_first"), False),
    ],
    ("chatml-brackets", "auto", True): [
        (BRACKET_CALL, True),
        ('[tool_call]{"arguments": {"a": 1}, "name": "get"}[/tool_call]', False),
        (GET_CALL, True),  # the hermes tag is plain text in this dialect
        ("[step]a [tool_call] b[/step][scratchpad]c[/scratchpad] [inner_monologue]d [tool_call]", True),
        ("[ste [step [tool_cal", True),
        ("[tool_call]", False),
        (f"[inner_monologue]x[/inner_monologue]{BRACKET_CALL}[step]y", True),
    ],
}
CASES = [
    pytest.param(spec, text, verdict, id=f"{spec[0]}-{spec[1]}-{'par' if spec[2] else 'one'}-{i}")
    for spec, rows in TABLE.items()
    for i, (text, verdict) in enumerate(rows)
]  # fmt: skip


@pytest.mark.parametrize("engine", ENGINE_NAMES)
@pytest.mark.parametrize(("spec", "text", "verdict"), CASES)
def test_every_engine_accepts_the_same_turn_language(
    engine: str, tokenizer: Any, spec: tuple[str, str, bool], text: str, verdict: bool
) -> None:
    dialect, choice, parallel = spec
    tool_choice = NAMED if choice == "named" else choice
    grammar = compiler_for(engine, tokenizer).compile(TOOLS, tool_choice, parallel, dialect=dialect)
    assert grammar.matcher().accepts_text(text) is verdict


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_whitespace_bound_is_a_setting(engine: str, tokenizer: Any) -> None:
    """``HERMES_VLLM_MAX_CALL_WHITESPACE`` widens every gap (pretty-printed calls) and stays a bound."""
    compiler = ToolGrammarCompiler(tokenizer, engine=engine, limits=Limits(max_call_whitespace=4))
    grammar = compiler.compile(TOOLS)
    # (llguidance bounds whitespace at separators only: none right after '{' of the arguments)
    indented = '<tool_call>\n{\n  "name": "get",\n  "arguments": {"a":\n   1,\n   "b": []}\n}\n</tool_call>'
    assert grammar.matcher().accepts_text(indented)
    assert not grammar.matcher().accepts_text(indented.replace('"a":\n   1', '"a":     1'))
    assert not compiler_for(engine, tokenizer).compile(TOOLS).matcher().accepts_text(indented)


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_no_whitespace_admits_compact_calls_only(engine: str, tokenizer: Any) -> None:
    """``HERMES_VLLM_MAX_CALL_WHITESPACE=0`` compiles (xgrammar refuses a whitespace count of 0;
    its compact option stands in) and admits no gap at all."""
    compiler = ToolGrammarCompiler(tokenizer, engine=engine, limits=Limits(max_call_whitespace=0))
    grammar = compiler.compile(TOOLS)
    compact = '<tool_call>{"name":"get","arguments":{"a":1,"b":["x","y"]}}</tool_call>'
    assert grammar.matcher().accepts_text(compact)
    for spaced in ('{"name": "get"', '"b":["x", "y"]', '{"a": 1'):
        text = compact.replace(spaced.replace(" ", ""), spaced)
        assert text != compact and not grammar.matcher().accepts_text(text), spaced


# Documented differences inside the arguments JSON (module docstrings): each engine's verdict,
# and xgrammar's opposite one, so that an upstream fix shows up here.
DIVERGENCES = [
    ("llguidance", '{"a": 1, "b": [ "c" ] }'),
    ("llguidance", '{ "a": 1}'),
    ("llguidance", '{"a": 1, "b": ["caf\\u00e9"]}'),
    ("llguidance", '{"a": 1, "b": ["\\/"]}'),
    ("outlines", '{"a": 1, "b": ["c" , "d"]}'),
    ("outlines", '{"a": 1, "b": ["caf\\u00e9"]}'),
    ("outlines", '{"a": 1, "b": ["\\u0001"]}'),
]


@pytest.mark.parametrize(("engine", "args"), DIVERGENCES)
def test_documented_json_divergences(engine: str, args: str, tokenizer: Any) -> None:
    text = hermes("get", args)
    assert compiler_for("xgrammar", tokenizer).compile(TOOLS).matcher().accepts_text(text)
    assert not compiler_for(engine, tokenizer).compile(TOOLS).matcher().accepts_text(text)


# --- token boundaries ---------------------------------------------------------------------------


def spell(tokenizer: Any, text: str, max_bytes: int = 64) -> list[int]:
    """Token ids whose bytes concatenate to ``text``: greedy longest match, each <= ``max_bytes``."""
    table = _byte_table(tokenizer)
    data, out, i = text.encode(), [], 0
    while i < len(data):
        size = next(n for n in range(min(max_bytes, len(data) - i), 0, -1) if data[i : i + n] in table)
        out.append(table[data[i : i + size]])
        i += size
    return out


_TABLES: dict[str, dict[bytes, int]] = {}


def _byte_table(tokenizer: Any) -> dict[bytes, int]:
    if tokenizer.name_or_path not in _TABLES:
        vocab = compiler_for("xgrammar", tokenizer).vocab
        table: dict[bytes, int] = {}
        for token_id, data in enumerate(vocab.decoded):
            if data and token_id not in vocab.stop_token_ids:
                table.setdefault(data, token_id)
        _TABLES[tokenizer.name_or_path] = table
    return _TABLES[tokenizer.name_or_path]


def token(tokenizer: Any, data: bytes) -> int:
    """The id of the single token spelled ``data`` (the test needs that exact token)."""
    table = _byte_table(tokenizer)
    assert data in table, f"{tokenizer.name_or_path} has no token {data!r}"
    return table[data]


def feed(matcher: Any, ids: list[int], vocab_size: int) -> Iterator[bool]:
    """Per token: whether the mask allowed it; then accept it (which must agree with the mask)."""
    bitmask = allocate_bitmask(1, vocab_size)
    for token_id in ids:
        matcher.fill_bitmask(bitmask, 0)
        allowed = bool((int(bitmask[0, token_id // 32]) >> (token_id % 32)) & 1)
        assert matcher.accept_token(token_id) is allowed, token_id
        yield allowed


def boundary_paths(tokenizer: Any) -> dict[str, tuple[str, list[int]]]:
    """Token paths through tool calls that no tokenizer would produce, but a model may sample."""
    body = '"name": "get", "arguments": {"a": 1}'
    return {
        # the bracket tags, one byte per token
        "tag-byte-by-byte": ("chatml-brackets", spell(tokenizer, f"x[tool_call]{{{body}}}[/tool_call]", 1)),
        # "]{" ends the opening tag and starts the JSON; "}[" ends the JSON and starts the closing tag
        "tag-end-and-json-start": (
            "chatml-brackets",
            [
                *spell(tokenizer, "x[tool_call"),
                token(tokenizer, b"]{"),
                *spell(tokenizer, body),
                token(tokenizer, b"}["),
                *spell(tokenizer, "/tool_call] y"),
            ],
        ),
        # the hermes tag is one added token, but the model may spell it, ending with ">{" / "}</"
        "spelled-added-tag": (
            "hermes",
            [
                *spell(tokenizer, "<tool_call", 3),
                token(tokenizer, b">{"),
                *spell(tokenizer, body),
                token(tokenizer, b"}</"),
                *spell(tokenizer, "tool_call>", 2),
            ],
        ),
    }


@pytest.mark.parametrize("engine", ENGINE_NAMES)
@pytest.mark.parametrize("path", ["tag-byte-by-byte", "tag-end-and-json-start", "spelled-added-tag"])
def test_token_boundaries_32k(engine: str, path: str, tokenizer: Any) -> None:
    _check_boundary_path(engine, path, tokenizer)


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("path", ["tag-byte-by-byte", "tag-end-and-json-start", "spelled-added-tag"])
def test_token_boundaries_131k(engine: str, path: str, tokenizer_131k: Any) -> None:
    # outlines-core on 131k tokens takes seconds per compile: its 131k run is the benchmark's.
    _check_boundary_path(engine, path, tokenizer_131k)


def _check_boundary_path(engine: str, path: str, tokenizer: Any) -> None:
    dialect, ids = boundary_paths(tokenizer)[path]
    compiler = compiler_for(engine, tokenizer)
    grammar = compiler.compile(TOOLS, dialect=dialect)
    assert all(feed(grammar.matcher().engine_matcher, ids, compiler.vocab.vocab_size))
    matcher = grammar.matcher()
    assert all(matcher.accept_token(i) for i in ids) and matcher.can_end()
    # The same path with the JSON broken right after the bridging token must be refused.
    wrong = grammar.matcher()
    cut = next(i for i, t in enumerate(ids) if compiler.vocab.decoded[t].endswith(b"{")) + 1
    assert all(wrong.accept_token(i) for i in ids[:cut])
    assert not wrong.accept_token(spell(tokenizer, "]")[0])


# --- matcher protocol -----------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_masks_stops_and_rollback(engine: str, tokenizer: Any) -> None:
    compiler = compiler_for(engine, tokenizer)
    grammar = compiler.compile(TOOLS)
    eos = compiler.vocab.stop_token_ids[0]
    extra_stop = tokenizer.convert_tokens_to_ids("<|im_start|>")
    matcher = grammar.matcher(stop_token_ids=[extra_stop])
    bitmask = allocate_bitmask(1, compiler.vocab.vocab_size)

    def allowed(token_id: int) -> bool:
        matcher.fill_bitmask(bitmask, 0)
        return bool((int(bitmask[0, token_id // 32]) >> (token_id % 32)) & 1)

    hello = spell(tokenizer, "hello")[0]
    assert allowed(hello) and allowed(eos) and allowed(extra_stop)
    opening = spell(tokenizer, "Hi <tool_call>")
    assert all(matcher.accept_token(i) for i in opening)
    # Inside the span: no free text, no stop token, only the JSON's start (and whitespace).
    assert not allowed(hello) and not allowed(eos) and not allowed(extra_stop)
    assert allowed(token(tokenizer, b"{")) and not matcher.accept_token(eos) and not matcher.can_end()
    matcher.rollback(1)
    assert allowed(hello) and matcher.can_end()
    assert matcher.accept_token(extra_stop) and matcher.is_terminated()
    assert not matcher.accept_token(hello)
    matcher.rollback(1)
    assert not matcher.is_terminated() and matcher.accept_token(hello)
    # Rolling back further than any history window, then replaying, reaches the same verdicts.
    rest = spell(
        tokenizer, ' <tool_call>{"name": "put", "arguments": {"x": "' + "z" * 40 + '"}}</tool_call>', 2
    )
    assert all(matcher.accept_token(i) for i in rest) and matcher.can_end()
    matcher.rollback(len(rest))
    assert matcher.can_end() and all(matcher.accept_token(i) for i in rest) and matcher.accept_token(eos)


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_a_fill_writes_the_whole_row_whatever_it_answers(engine: str, tokenizer: Any) -> None:
    """An engine matcher's fill writes every word of its row, also where it answers False (every
    token allowed): a hot path takes the row as written and does not fill it again
    (:meth:`EngineMatcher.fill_bitmask`), as vLLM's own xgrammar backend does."""
    compiler = compiler_for(engine, tokenizer)
    matcher = compiler.compile(TOOLS).matcher().engine_matcher
    bitmask = allocate_bitmask(2, compiler.vocab.vocab_size)
    text = 'Hi <tool_call>{"name": "put", "arguments": {"x": "z"}}</tool_call>'
    answers = []
    for token_id in [None, *spell(tokenizer, text)]:
        if token_id is not None:
            assert matcher.accept_token(token_id)
        bitmask[0].fill_(0)
        bitmask[1].fill_(0x5A5A5A5A)
        answers.append(matcher.fill_bitmask(bitmask, 0))
        assert matcher.fill_bitmask(bitmask, 1) == answers[-1]
        assert torch.equal(bitmask[0], bitmask[1]), token_id
        if not answers[-1]:
            assert bool((bitmask[0] == -1).all())


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_batch_fill_matches_row_fills(engine: str, tokenizer: Any) -> None:
    compiler = compiler_for(engine, tokenizer)
    grammar = compiler.compile(TOOLS)
    matchers = [grammar.matcher().engine_matcher for _ in range(3)]
    for m, text in zip(matchers, ["free", "x <tool_call>", '<tool_call>{"name": "get"'], strict=True):
        assert all(m.accept_token(i) for i in spell(tokenizer, text))
    size = compiler.vocab.vocab_size
    batch, rows = allocate_bitmask(4, size), allocate_bitmask(4, size)
    compiler.engine.fill_bitmasks(matchers, batch, [3, 0, 2])
    for m, row in zip(matchers, [3, 0, 2], strict=True):
        m.fill_bitmask(rows, row)
    assert torch.equal(batch, rows) and not torch.equal(batch[0], batch[3])


# --- keyword coverage ---------------------------------------------------------------------------

# One small schema per constraining keyword (as the value of property "v").
KEYWORD_SCHEMAS: dict[str, dict[str, Any]] = {
    "type": {"type": "integer"},
    "enum": {"enum": ["a", "b"]},
    "const": {"const": "a"},
    "multipleOf": {"type": "integer", "multipleOf": 3},
    "maximum": {"type": "integer", "maximum": 3},
    "exclusiveMaximum": {"type": "integer", "exclusiveMaximum": 3},
    "minimum": {"type": "integer", "minimum": 3},
    "exclusiveMinimum": {"type": "integer", "exclusiveMinimum": 3},
    "maxLength": {"type": "string", "maxLength": 3},
    "minLength": {"type": "string", "minLength": 3},
    "pattern": {"type": "string", "pattern": "^a+$"},
    "maxItems": {"type": "array", "items": {"type": "integer"}, "maxItems": 2},
    "minItems": {"type": "array", "items": {"type": "integer"}, "minItems": 2},
    # over items that cannot always be written on (here bounded), which the processor cannot keep
    "uniqueItems": {"type": "array", "items": {"type": "integer", "maximum": 9}, "uniqueItems": True},
    "contains": {"type": "array", "contains": {"type": "integer"}},
    "maxProperties": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1},
    "minProperties": {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1},
    "prefixItems": {"type": "array", "prefixItems": [{"type": "integer"}], "items": False},
    "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
    "propertyNames": {
        "type": "object",
        "additionalProperties": {"type": "integer"},
        "propertyNames": {"format": "date"},
    },
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "not": {"not": {"type": "integer"}},
    "if": {"if": {"type": "integer"}, "then": {"minimum": 0}},
}
# Whether the engine enforces (valid, invalid) for the supported keywords checked end to end.
ENFORCED: dict[str, tuple[Any, Any]] = {
    "enum": ("a", "c"),
    "maximum": (3, 4),
    "minItems": ([1, 2], [1]),
    "pattern": ("aa", "ab"),
    "maxLength": ("abc", "abcd"),
    "propertyNames": ({"2020-01-02": 1}, {"2020-01-32": 1}),
}


@pytest.mark.parametrize("engine", ENGINE_NAMES)
@pytest.mark.parametrize("keyword", list(KEYWORD_SCHEMAS))
def test_strict_coverage_refuses_what_each_engine_cannot_enforce(
    engine: str, keyword: str, tokenizer: Any
) -> None:
    supported = get_engine_class(engine).supported_keywords
    assert supported <= CONSTRAINING
    params = {"type": "object", "properties": {"v": KEYWORD_SCHEMAS[keyword]}}
    compiler = compiler_for(engine, tokenizer)
    if keyword in supported:
        assert not compiler.prepare([tool(params)], coverage="lenient").needs_validation
        return
    with pytest.raises(ToolSchemaError, match=re.escape(f"'{keyword}' at parameters/properties/v")) as err:
        compiler.prepare([tool(params)], coverage="strict")
    assert engine in str(err.value)
    assert compiler.prepare([tool(params)], coverage="lenient").needs_validation


@pytest.mark.parametrize("engine", ENGINE_NAMES)
@pytest.mark.parametrize("keyword", list(ENFORCED))
def test_supported_keywords_are_enforced(engine: str, keyword: str, tokenizer: Any) -> None:
    if keyword not in get_engine_class(engine).supported_keywords:
        pytest.skip(f"{engine} does not support {keyword}")
    grammar = compiler_for(engine, tokenizer).compile([tool({"type": "object", "properties": {
        "v": KEYWORD_SCHEMAS[keyword]}, "required": ["v"]}, "t")])  # fmt: skip
    valid, invalid = ENFORCED[keyword]
    call = '<tool_call>{{"name": "t", "arguments": {{"v": {}}}}}</tool_call>'
    assert grammar.matcher().accepts_text(call.format(json.dumps(valid)))
    assert not grammar.matcher().accepts_text(call.format(json.dumps(invalid)))


def test_outlines_numeric_bounds_and_lengths_are_refused_not_dropped(tokenizer: Any) -> None:
    compiler = compiler_for("outlines", tokenizer)
    for keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "maxLength"):
        with pytest.raises(ToolSchemaError, match=f"outlines engine cannot enforce '{keyword}'"):
            compiler.prepare([tool({"type": "object", "properties": {"v": KEYWORD_SCHEMAS[keyword]}})])


def test_outlines_blow_ups_are_refused_before_compiling(tokenizer: Any) -> None:
    big = {"type": "array", "items": {"type": "string"}, "maxItems": MAX_ITEMS_BOUND + 1}
    spec = turn_spec(normalize_tools([tool({"type": "object", "properties": {"v": big}}, "t")]))
    with pytest.raises(ValueError, match="maxItems"):
        OutlinesEngine.check(spec)
    long = turn_spec(
        normalize_tools([tool({"type": "object", "properties": {"v": KEYWORD_SCHEMAS["maxLength"]}})])
    )
    with pytest.raises(ValueError, match="maxLength"):
        OutlinesEngine.check(long)
    open_tuple = {"type": "object", "properties": {"v": KEYWORD_SCHEMAS["prefixItems"]}}  # no minItems
    with pytest.raises(ValueError, match="'prefixItems' other than a closed tuple"):
        OutlinesEngine.check(turn_spec(normalize_tools([tool(open_tuple)])))
    with pytest.raises(GrammarCompileError, match="maxItems"):
        compiler_for("outlines", tokenizer).compile([tool({"type": "object", "properties": {"v": big}})])
    open_json = {"type": "object", "properties": {f"v{i}": {} for i in range(3)}}
    with pytest.raises(ValueError, match="regex, over the outlines engine's limit"):
        OutlinesEngine.check(turn_spec(normalize_tools([tool(open_json)])))


def test_llguidance_refusals_name_the_tool_and_keyword(tokenizer: Any) -> None:
    unique = {"type": "object", "properties": {"v": KEYWORD_SCHEMAS["uniqueItems"]}}
    with pytest.raises(ValueError, match=r"tool 'u'.*uniqueItems"):  # the frontend check, no tokenizer
        get_engine_class("llguidance").check(turn_spec(normalize_tools([tool(unique, "u")])))
    optional = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}, "minProperties": 2}
    with pytest.raises(GrammarCompileError, match=r"tool 'picky'.*min/maxProperties"):
        compiler_for("llguidance", tokenizer).compile([tool(optional, "picky"), tool(PUT, "put")])
    # integral floats are integers to JSON Schema (llguidance alone would refuse 2.0)
    floats = {"type": "object", "properties": {"v": {"type": "array", "maxItems": 2.0}}}
    assert (
        compiler_for("llguidance", tokenizer)
        .compile([tool(floats, "t")])
        .matcher()
        .accepts_text('<tool_call>{"name": "t", "arguments": {"v": [1, 2]}}</tool_call>')
    )


def test_xgrammar_takes_integral_floats_as_integers(tokenizer: Any) -> None:
    """JSON Schema compares numbers by value: ``maxItems: 2.0`` is a count, ``const: 2.0`` is 2."""
    floats = {"type": "object", "properties": {"v": {"type": "array", "maxItems": 2.0}, "c": {"const": 2.0}}}
    grammar = compiler_for("xgrammar", tokenizer).compile([tool(floats, "t")])
    call = '<tool_call>{"name": "t", "arguments": {"v": [1, 2], "c": 2}}</tool_call>'
    assert grammar.matcher().accepts_text(call)
    assert not grammar.matcher().accepts_text(call.replace("[1, 2]", "[1, 2, 3]"))


# Objects and arrays in `const`/`enum`, nested, each spelled compact, as `json.dumps` spaces it, and
# wrong (a different value, or a gap over the whitespace bound).
CONTAINER_VALUES = {
    "v": {"const": {"a": False, "b": [1, {"c": None}]}},
    "w": {"enum": ["x", [1, 2], {"d": []}]},
}
CONTAINER_CALLS = [
    ('{"v": {"a": false, "b": [1, {"c": null}]}, "w": [1, 2]}', True),
    ('{"v": {"a":false,"b":[1,{"c":null}]}, "w": {"d": []}}', True),
    ('{"v": {"a": false, "b": [1, {"c": null}]}, "w": "x"}', True),
    ('{"v": {"a": false, "b": [1, {"c": null}]}, "w": [1, 2, 3]}', False),
    ('{"v": {"a": false, "b": [1, {"c": 0}]}, "w": "x"}', False),
    ('{"v": {"a": false, "b": [1]}, "w": "x"}', False),
    ('{"v": {"a": false, "b": [1, {"c": null}], "e": 1}, "w": "x"}', False),
    ('{"v": {"a":  false, "b": [1, {"c": null}]}, "w": "x"}', False),
]


@pytest.mark.parametrize("engine", ENGINE_NAMES)
@pytest.mark.parametrize(("args", "verdict"), CONTAINER_CALLS)
def test_container_const_and_enum_take_the_whitespace_policy(
    engine: str, args: str, verdict: bool, tokenizer: Any
) -> None:
    """An object or array value is one literal to engines (xgrammar took its compact spelling only)."""
    params = {"type": "object", "properties": CONTAINER_VALUES, "required": ["v", "w"]}
    grammar = compiler_for(engine, tokenizer).compile([tool(params, "t")])
    assert grammar.matcher().accepts_text(hermes("t", args)) is verdict


# --- the outlines free-text regex -------------------------------------------------------------------

TAG_SETS = [
    ["<tool_call>"],
    ["<tool_call>", "<think>"],
    ["[tool_call]", "[inner_monologue]", "[step]", "[scratchpad]"],
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(TAG_SETS), st.data())
def test_outlines_free_text_is_exactly_text_without_tags(tags: list[str], data: st.DataObject) -> None:
    pieces = st.sampled_from(
        [*tags, *(t[:k] for t in tags for k in range(1, len(t))), "x", "é", "\n", "<", "["]
    )
    text = "".join(data.draw(st.lists(pieces, max_size=8)))
    assert (re.fullmatch(avoiding(tags), text, re.S) is not None) == (not any(t in text for t in tags))
    assert re.fullmatch(avoiding(tags), text + END, re.S) is None


def test_outlines_refuses_tags_it_cannot_write_as_a_small_regex() -> None:
    with pytest.raises(ValueError, match="first character"):
        avoiding(["<a<b>"])


def test_auto_engine_routes_what_xgrammar_compiles_slowly_or_cannot_enforce(tokenizer_131k: Any) -> None:
    """The server's default: xgrammar, llguidance for length-bounded strings and its extra keywords.

    (xgrammar alone takes ~5 s for ``maxLength: 100`` on 131k tokens: benchmarks/compile.py; the
    routing, not a wall-clock bound, is what is checked here.)"""
    from hermes_vllm.grammar import ToolGrammarCompiler
    from hermes_vllm.grammar.engines.llguidance import LLGuidanceGrammar
    from hermes_vllm.grammar.engines.xgrammar import XGrammarGrammar

    compiler = ToolGrammarCompiler(tokenizer_131k, engine="auto")
    cases = [
        ({"type": "integer"}, XGrammarGrammar, "1"),
        ({"type": "string", "maxLength": 100}, LLGuidanceGrammar, '"abc"'),
        (
            {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
            LLGuidanceGrammar,
            '{"xa": 3}',
        ),
    ]
    for schema, kind, value in cases:
        tool = {
            "type": "function",
            "function": {"name": "t", "parameters": {"type": "object", "properties": {"a": schema}}},
        }
        grammar = compiler.compile([tool])
        assert isinstance(grammar.grammar, kind), schema
        assert grammar.matcher().accepts_text(
            f'<tool_call>{{"name": "t", "arguments": {{"a": {value}}}}}</tool_call>'
        )
        assert not grammar.matcher().accepts_text(
            '<tool_call>{"name": "t", "arguments": {"a": []}}</tool_call>'
        )


GATE_TURNS = {
    "hermes": 'Hi héllo 你好 🙂<tool_call>{"name": "put", "arguments": {"x": "a</tool_call>é"}}</tool_call> then '
    '<think>a <tool_call> b</think> end <tool_call>\n{"arguments": {"x": "🙂"}, "name": "put"}\n</tool_call>',
    "chatml-brackets": 'Hi héllo [tool_call]{"name": "put", "arguments": {"x": "[/tool_call]"}}[/tool_call] ok '
    '[inner_monologue]x[tool_call][/inner_monologue] 你好[tool_call]{"name": "put", "arguments": {"x": "y"}}'
    "[/tool_call]",
}


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("dialect", sorted(GATE_TURNS))
def test_gated_matcher_masks_exactly_like_the_engine(engine: str, dialect: str, any_tokenizer: Any) -> None:
    """At clean points the public matcher leaves the engine alone: it copies the start mask and
    reads it to accept tokens. Masks, verdicts and ends must be the engine's at every step (split
    characters, tags in strings and spans, rejected tokens, rollbacks, the stop token)."""
    # Padded ids, as a model's vocabulary often has: refused everywhere, clean points included.
    compiler = ToolGrammarCompiler(
        any_tokenizer, engine=engine, dialect=dialect, vocab_size=len(any_tokenizer) + 64
    )
    compiled = compiler.compile([tool(PUT, "put")])
    gated, plain = compiled.matcher(), compiled.matcher(gated=False)
    width = compiler.vocab.vocab_size
    a, b = allocate_bitmask(1, width), allocate_bitmask(1, width)
    ids = any_tokenizer.encode(GATE_TURNS[dialect], add_special_tokens=False)
    # Tokens to offer where the mask refuses them: a padded id, a stray close, a quote, a brace.
    texts = ["</tool_call>", "[/tool_call]", '"', "}"]
    probes = [width - 1, *(any_tokenizer.encode(t, add_special_tokens=False)[-1] for t in texts)]
    skipped = refusals = 0

    def same_state(step: int) -> bool:
        a.zero_()
        gated.fill_bitmask(a, 0)
        plain.fill_bitmask(b, 0)
        assert torch.equal(a, b), f"step {step}: {any_tokenizer.decode(ids[:step])!r}"
        assert gated.can_end() == plain.can_end() and not gated.is_terminated()
        refused = [t for t in probes if not b[0, t >> 5] >> (t & 31) & 1]
        for token in refused[:3]:
            assert not gated.accept_token(token) and not plain.accept_token(token), (step, token)
        return bool(refused)

    for step, token in enumerate(ids):
        refusals += same_state(step)
        skipped += gated._gate is not None and gated._gate.clean
        assert gated.accept_token(token) and plain.accept_token(token)
        if step in (len(ids) // 2, len(ids) // 4, 12):  # in calls, and across call and span tags
            gated.rollback(3)
            plain.rollback(3)
            same_state(step)
            for again in ids[step - 2 : step + 1]:
                assert gated.accept_token(again) and plain.accept_token(again)
    same_state(len(ids))
    stop = any_tokenizer.eos_token_id
    assert gated.accept_token(stop) and plain.accept_token(stop)
    assert gated.is_terminated() and plain.is_terminated()
    assert not gated.accept_token(ids[0]) and not plain.accept_token(ids[0])
    assert skipped >= 8, "the test must go through clean points"
    assert refusals >= 8, "the test must offer refused tokens"


def test_gated_matcher_keeps_a_bounded_window_and_rolls_back_across_it(tokenizer: Any) -> None:
    """The gate keeps where it stood for the last ``GATE_ROLLBACK`` tokens only (its history once
    grew with every token of a turn, and a rollback replayed all of it): a rollback across clean
    points, a call and a split character within the window lands where the engine does; one
    beyond it is refused, the matcher unchanged."""
    compiled = compiler_for("xgrammar", tokenizer).compile([tool(PUT, "put")])
    gated, plain = compiled.matcher(), compiled.matcher(gated=False)
    a, b = allocate_bitmask(1, compiled.vocab.vocab_size), allocate_bitmask(1, compiled.vocab.vocab_size)
    turn = "free text 你好 " * 60 + GATE_TURNS["hermes"]
    ids = tokenizer.encode(turn, add_special_tokens=False)
    assert len(ids) > GATE_ROLLBACK + 16, "the turn must outgrow the window"
    for token in ids:
        assert gated.accept_token(token) and plain.accept_token(token)
    gated.rollback(GATE_ROLLBACK)
    plain.rollback(GATE_ROLLBACK)
    for token in ids[-GATE_ROLLBACK:]:
        gated.fill_bitmask(a, 0)
        plain.fill_bitmask(b, 0)
        assert torch.equal(a, b) and gated.can_end() == plain.can_end()
        assert gated.accept_token(token) and plain.accept_token(token)
    with pytest.raises(ValueError, match="cannot roll back"):
        gated.rollback(GATE_ROLLBACK + 1)
    assert gated.accepted == plain.accepted and gated.can_end() and gated.accept_token(tokenizer.eos_token_id)


def test_a_vocabulary_and_its_tables_are_built_once_per_tokenizer(tokenizer: Any) -> None:
    """Compilers of one tokenizer share one :class:`Vocabulary`, which owns every table derived
    from it (they lived in module globals keyed by its fingerprint, one without a lock); another
    width is another vocabulary, with tables of its own."""
    first = ToolGrammarCompiler(tokenizer, engine="xgrammar").vocab
    again = ToolGrammarCompiler(tokenizer, engine="llguidance").vocab
    assert again is first
    assert sorted_vocabulary(again) is sorted_vocabulary(first) and first.has_table("sorted")
    wider = ToolGrammarCompiler(tokenizer, vocab_size=len(tokenizer) + 64).vocab
    assert wider is not first and wider.vocab_size == len(tokenizer) + 64 and not wider.has_table("sorted")


@pytest.mark.parametrize(
    ("choice", "parallel", "answer", "shape"),
    [
        ("auto", True, False, ((), False, "any", "any", True)),
        ("auto", False, False, ((), False, "one", "none", True)),
        ("required", True, False, ((), True, "any", "any", True)),
        ("required", False, False, ((), True, "none", "none", True)),
        ("none", True, False, ((), False, "none", "any", False)),
        ("auto", True, True, (("calls", "answer"), False, "any", "any", True)),
        ("required", False, True, (("calls",), False, "one", "none", True)),
        ("none", True, True, (("answer",), False, "one", "any", False)),
    ],
)
def test_a_turns_shape_is_decided_once_for_every_engine(
    choice: str, parallel: bool, answer: bool, shape: tuple[Any, ...], tokenizer: Any
) -> None:
    """Mode x parallel calls x answer become one :class:`TurnShape` (each engine decided it
    itself), and every engine's grammar of the turn is a printing of it: a turn that opens with
    a call refuses free text first on each, one that allows one call refuses a second."""
    schema = {"type": "object", "properties": {"r": {"type": "string"}}, "required": ["r"]}
    specs = normalize_tools(TOOLS, Limits())
    written = normalize_tools([tool(schema, "a")], Limits())[0] if answer else None
    assert astuple(turn_shape(turn_spec(specs, choice, parallel, answer=written))) == shape
    if answer:  # the answer's printing is read by tests/test_answer.py
        return
    ids = tokenizer.encode("Hi " + PUT_CALL + " then " + PUT_CALL, add_special_tokens=False)
    for engine in ("xgrammar", "llguidance", "outlines"):
        matcher = compiler_for(engine, tokenizer).compile(TOOLS, choice, parallel).matcher()
        accepted = all(matcher.accept_token(t) for t in ids)
        assert accepted == (shape[2] == "any" and not shape[1]), (engine, choice, parallel)


@pytest.mark.parametrize(
    ("parameters", "repeats"),
    [
        ({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, True),
        (
            {
                "type": "object",
                "properties": {
                    "q": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "at": {"type": "object", "properties": {"x": {"type": ["number", "null"]}}},
                },
            },
            True,
        ),
        ({"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}}, False),
        ({"type": "object", "properties": {"city": {"type": "string", "minLength": 3}}}, False),
        ({"type": "object", "properties": {"city": {"type": "string", "pattern": "^[a-z]+$"}}}, False),
        ({"type": "object", "properties": {"day": {"type": "string", "format": "date"}}}, False),
        ({"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}}, False),
        ({"type": "object", "properties": {"unit": {"const": "c"}}}, False),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True}, False),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "additionalProperties": {"type": "string"},
            },
            False,
        ),
        ({"type": "object", "properties": {"any": {}}}, False),
        ({"type": "object", "properties": {"d": {"type": "object"}}}, False),
        ({"type": "object", "properties": {"l": {"type": "array"}}}, False),
        (
            {
                "type": "object",
                "properties": {"l": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
            },
            False,
        ),
        ({"type": "object", "properties": {"k" * 5000: {"type": "string"}}}, False),
    ],
)
def test_masks_repeat_inside_strings_only_where_every_string_is_unbounded_and_every_key_fixed(
    parameters: dict[str, Any], repeats: bool
) -> None:
    """A mask allowing every plain string token is the mask again after one only where the
    matcher can stand nowhere else than inside an unbounded string value: no string under a
    length, pattern, format or literal, no free key beside fixed ones, no value of any shape, and
    property names too few to allow every plain token at a key (``strings_repeat``; the hosted
    rows' fills rely on it, ``tests/test_speculative.py``)."""
    from hermes_vllm.grammar.engines.xgrammar import strings_repeat

    assert strings_repeat(turn_spec(normalize_tools([tool(parameters, "t")]))) is repeats
