"""The default engine: xgrammar (the fastest masks inside calls).

The turn is one EBNF grammar, written here: free text that holds no tag's begin (a TagDispatch
rule), the call and span tags after it (robust to any token boundary, since xgrammar matches the
tag text byte by byte), a JSON-schema call body, and an optional unclosed reasoning/hidden span at
the end so that free text and reasoning may stop anywhere. Each tool's arguments come from
xgrammar's JSON-schema conversion; its basic JSON rules are the same text for every schema and
are kept once (each copy took its own masks). Writing the EBNF directly costs less than going
through xgrammar's structural tags and merging their copies afterwards. Each whitespace gap is then
folded into the element after it, and rules that match the same text are written once
(:mod:`.ebnf`): tools repeat each other's enums, objects and folded gaps, and merging leaves a
third of 400 BFCL tools' rules (xgrammar builds the masks of every rule: the compile and the masks
in a call cost less; docs/architecture.md, "Measurements behind the code").
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from functools import cache, lru_cache, partial
from typing import Any

import torch
import tvm_ffi
import xgrammar as xgr
from xgrammar.base import _core

from hermes_vllm.grammar.cache import GrammarCache
from hermes_vllm.grammar.engines.base import (
    KEY_CHARACTERS_MAX,
    Direct,
    EngineGrammar,
    EngineMatcher,
    GrammarEngine,
)
from hermes_vllm.grammar.engines.composed import (
    PLACEHOLDER,
    ComposedGrammar,
    batch_inner,
    composable,
    sort_ahead,
    sorted_vocabulary,
)
from hermes_vllm.grammar.engines.ebnf import (
    Rule,
    fold_gaps,
    join_rules,
    merge_equal_rules,
    reachable,
    rename,
    split_rules,
)
from hermes_vllm.grammar.turn import LEAD_WHITESPACE, tag_initials, turn_shape
from hermes_vllm.memo import memoize_small
from hermes_vllm.schema import ToolSpec, canonical_json, canonical_value, iter_subschemas
from hermes_vllm.schema.formats import formats_as_patterns
from hermes_vllm.schema.regex import literal_characters, optional_groups_spelled_out
from hermes_vllm.schema.spec import pointer
from hermes_vllm.settings import get_limits
from hermes_vllm.turn import MARK, TurnSpec
from hermes_vllm.vocabulary import Vocabulary

# Measured on the JSON-Schema-Test-Suite (benchmarks/soundness.py): xgrammar enforces these once
# schema.make_explicit has spelled out types and defaults, and schema.uncovered_keywords refuses
# them where they sit beside '$ref'/'anyOf' or combine 'pattern' with lengths. Left out because
# xgrammar silently ignores or mis-enforces them: uniqueItems, not, if/then/else, oneOf/allOf
# (unless rewritten), dependent*, contains, unevaluated*; patternProperties
# (patterns taken as whole-key matches, '^'/'$' break them, and beside 'properties' no key is
# accepted at all). multipleOf is enforced exactly for type integer with a whole divisor up to
# 1024 and no range bound beside it, and ignored elsewhere: schema.coverage refuses it there.
# propertyNames is enforced (the key is the names schema's string rule) in the one shape
# schema.names serves; coverage refuses it elsewhere.
XGRAMMAR_KEYWORDS = frozenset(
    {
        "type", "enum", "const", "properties", "required", "additionalProperties",
        "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf",
        "$ref", "$defs", "definitions", "minProperties", "maxProperties", "multipleOf", "propertyNames",
    }
)  # fmt: skip


_CPP_LOCATION = re.compile(r"^.*?\.cc:\d+: ")

# A cached grammar keeps more resident memory than ``memory_size_bytes`` counts (allocator overhead
# of its many small mask vectors), and xgrammar's own cache more than ``get_cache_size_bytes`` says
# (benchmarks/memory.py --mode compile; the ratios in docs/architecture.md, "Measurements behind the
# code"). Our byte limits mean resident memory, so both counts are scaled, with a margin.
RESIDENT_PER_COUNTED_BYTE = 2.0
XGRAMMAR_CACHE_UNDERCOUNT = 4


def _literal(text: str) -> str:
    """``text`` as an EBNF string literal."""
    escaped = (
        "\\" + ch if ch in '"\\' else f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch
        for ch in text
    )
    return '"' + "".join(escaped) + '"'


def _choice(alternatives: Sequence[str]) -> str:
    return "(" + " | ".join(f"({a})" if a else '""' for a in alternatives) + ")"


def _readable_patterns(parameters: Any) -> Any:
    """The arguments schema with each enforced ``format`` as its pattern, and every pattern
    spelled so that xgrammar reads it right (:func:`optional_groups_spelled_out`)."""
    schema = formats_as_patterns(parameters, raw_safe=True)
    if schema is parameters:
        schema = copy.deepcopy(parameters)
    for _, sub in iter_subschemas(schema):
        if isinstance(sub.get("pattern"), str):
            sub["pattern"] = optional_groups_spelled_out(sub["pattern"])
    return schema


@memoize_small(lambda schema, max_whitespace: len(schema))
def _schema_rules(schema: str, max_whitespace: int) -> tuple[Mapping[str, str], frozenset[str]]:
    """xgrammar's JSON-schema conversion of one tool's parameters (canonical JSON text): its rules
    by name, and which of them are its basic JSON rules or reached from them. Memoised: agents'
    tool sets shift by a tool or two and share tools with each other, and converting was a third of
    our share of a many-tool compile (docs/architecture.md, "Measurements behind the code"). An
    enforced ``format`` becomes its pattern here (xgrammar's own format grammars reject valid
    strings), and every pattern is respelled where xgrammar would misread it."""
    if '"format"' in schema or '"pattern"' in schema:
        schema = json.dumps(_readable_patterns(json.loads(schema)), ensure_ascii=False)
    if max_whitespace == 0:  # xgrammar refuses a count of 0: compact JSON is its own option
        grammar = xgr.Grammar.from_json_schema(
            schema, any_whitespace=False, separators=(",", ":"), strict_mode=True
        )
    else:
        grammar = xgr.Grammar.from_json_schema(schema, max_whitespace_cnt=max_whitespace, strict_mode=True)
    rules = dict(split_rules(str(grammar)))
    return rules, frozenset(reachable(rules, (name for name in rules if name.startswith("basic_"))))


def _arguments_rules(index: int, parameters: Any, max_whitespace: int, basics: dict[str, str]) -> list[Rule]:
    """One tool's arguments grammar, from xgrammar's JSON-schema conversion, its rules renamed
    ``t<index>_...``. xgrammar's basic JSON rules (and the whitespace rules they use) are the same
    text for every schema: the first tool's copy goes to ``basics``, later equal copies are dropped."""
    # Integral floats as integers, as xgrammar's structural tags take them.
    rules, common = _schema_rules(json.dumps(canonical_value(parameters), ensure_ascii=False), max_whitespace)
    if not basics:
        basics.update((name, rules[name]) for name in common)
    shared = common if all(basics.get(name) == rules[name] for name in common) else set()
    renamed = {name: f"t{index}_{name}" for name in rules if name not in shared}
    return [(renamed[name], rename(body, renamed)) for name, body in rules.items() if name in renamed]


_STRING_CHARACTERS = re.compile(r'\[\^((?:\\0-\\x1f)?\\"\\\\\\r\\n)\]')
"""The character classes of a JSON string's unescaped characters in xgrammar's conversion."""


def _answer_rules(turn: TurnSpec, answer: ToolSpec) -> list[Rule]:
    """The final answer's grammar, ``t<n>_root`` after the turn's n tools, with rules of its own
    (none shared with the calls): its strings may not hold a tag's first character unescaped, so
    no tag can be spelled inside the answer (``<`` is written ``\\u003c``, which JSON reads as
    ``<``). The answer is free text to every reader of spans (parsers, the processor's budget):
    a raw tag there would open a call or a reasoning span in their eyes."""
    banned = tag_initials(turn.dialect)
    text = json.dumps(canonical_value(answer.parameters), ensure_ascii=False)
    rules, _ = _schema_rules(text, turn.max_whitespace)
    renamed = {name: f"t{len(turn.tools)}_{name}" for name in rules}
    return [
        (renamed[name], _STRING_CHARACTERS.sub(lambda m: f"[^{m.group(1)}{banned}]", rename(body, renamed)))
        for name, body in rules.items()
    ]


def _call_rules(turn: TurnSpec, gap: str, basics: dict[str, str]) -> list[Rule]:
    """``turn_call``: the call tag around ``{"name": NAME, "arguments": ARGS}`` (or arguments
    first), any tool. The text shared by all tools (the brace and the first key) is written once,
    so a tool set of n tools adds n small branches rather than n copies of the call's head. The
    basic JSON rules go to ``basics``, for the caller to write once."""
    d = turn.dialect
    rules: list[Rule] = []
    for i, tool in enumerate(turn.tools):
        rules += _arguments_rules(i, tool.parameters, turn.max_whitespace, basics)
    names = [_literal(json.dumps(t.name, ensure_ascii=False)) for t in turn.tools]
    orders = ("name_first", "arguments_first") if d.key_order == "either" else (d.key_order,)
    heads = []
    for order in orders:
        if order == "name_first":
            per_tool = [
                f'{n} {gap} "," {gap} "\\"arguments\\"" {gap} ":" {gap} t{i}_root'
                for i, n in enumerate(names)
            ]
            heads.append(f'"\\"name\\"" {gap} ":" {gap} turn_{order}')
        else:
            per_tool = [
                f't{i}_root {gap} "," {gap} "\\"name\\"" {gap} ":" {gap} {n}' for i, n in enumerate(names)
            ]
            heads.append(f'"\\"arguments\\"" {gap} ":" {gap} turn_{order}')
        rules.append((f"turn_{order}", _choice(per_tool)))
    begin, end = _literal(d.tool_call.begin), _literal(d.tool_call.end)
    return [
        *rules,
        ("turn_call_body", _choice(heads)),
        ("turn_call", f'(({begin} {gap} "{{" {gap} turn_call_body {gap} "}}" {gap} {end}))'),
    ]


def turn_ebnf(
    turn: TurnSpec, call: Sequence[Rule] | None = None, after_call: Callable[[str], str] | None = None
) -> str:
    """The whole turn as xgrammar EBNF (see the module docstring for the shape), gaps not yet folded.

    ``call`` replaces the rules of ``turn_call`` (the composed matcher's head grammar writes one
    placeholder call); with ``after_call`` (an EBNF sequence, given the call's whitespace gap),
    the grammar is that sequence then what may follow a call in this turn: the rest of a call
    from its arguments on, for the composed matcher's per-tool grammars.
    """
    d = turn.dialect
    shape = turn_shape(turn)
    gap, lead = f"turn_ws{{0, {turn.max_whitespace}}}", f"turn_ws{{0, {LEAD_WHITESPACE}}}"
    rules: list[Rule] = [("turn_ws", "(([ \\t\\n\\r]))")]
    basics: dict[str, str] = {}
    if call is not None:
        rules += call
    elif shape.may_call:
        rules += _call_rules(turn, gap, basics)
    answer = f"t{len(turn.tools)}_root"
    if "answer" in shape.endings and turn.answer is not None:
        rules += _answer_rules(turn, turn.answer)
    rules += basics.items()

    # Free text is text holding no tag's begin, then tags each followed by such text. Spelled
    # this way rather than as xgrammar's triggered tags, the text rule is the same for every
    # tool set, so xgrammar's cache keeps its token masks.
    excludes = ", ".join(_literal(t) for t in (d.tool_call.begin, *(p.begin for p in d.free_spans)))
    rules.append(("turn_text", f"TagDispatch(loop_after_dispatch=false, excludes=({excludes}))"))
    spans = [f"turn_span_{k}" for k in range(len(d.free_spans))]
    for span, p in zip(spans, d.free_spans, strict=True):
        rules += [
            (f"{span}_text", f"TagDispatch(loop_after_dispatch=false, excludes=({_literal(p.end)}))"),
            (span, f"(({_literal(p.begin)} {span}_text {_literal(p.end)}))"),
        ]

    def free_text(with_calls: bool) -> str:
        tags = (["turn_call"] if with_calls else []) + spans
        if not tags:
            return "turn_text"
        name = "turn_free_calls" if with_calls else "turn_free"
        if (f"{name}_tag", _choice(tags)) not in rules:  # written once, however often it is used
            rules.append((f"{name}_tag", _choice(tags)))
            rules.append((f"{name}_star", _choice(["", f"{name}_tag turn_text {name}_star"])))
        return f"turn_text {name}_star"

    def after_lead(body: str) -> str:
        """``body`` after the reasoning / hidden spans that may lead the turn (each after some
        whitespace), where a turn's free text is not free."""
        if not spans:
            return body
        rules.append(("turn_lead_span", _choice(spans)))
        rules.append(("turn_lead", _choice(["", f"{lead} turn_lead_span turn_lead"])))
        return f"turn_lead {body}"

    if after_call is not None:
        body = f"{after_call(gap)} {free_text(shape.after_call == 'any')}"
    elif shape.endings:
        mark = _choice(["", _literal(MARK)])
        calls = f"turn_call {mark}"
        if shape.calls == "any":
            rules.append(("turn_calls", _choice([mark, f"{lead} turn_call turn_calls"])))
            calls = "turn_call turn_calls"
        written = [{"calls": calls, "answer": answer}[e] for e in shape.endings]
        ending = _choice(written) if len(written) > 1 else written[0]
        rules.append(("root", f"(({after_lead(f'{lead} {ending} {lead}')}))"))
        return join_rules(rules)
    elif shape.opens_with_call:
        body = after_lead(f"{lead} turn_call {free_text(shape.calls == 'any')}")
    elif shape.calls == "one":
        rules.append(("turn_then", _choice(["", f"turn_call {free_text(False)}"])))
        body = f"{free_text(False)} turn_then"
    else:
        body = free_text(shape.calls == "any")
    if spans:  # the output may end inside an unclosed span
        rules.append(
            (
                "turn_tail",
                _choice(
                    ["", *(f"{_literal(p.begin)} {s}_text" for s, p in zip(spans, d.free_spans, strict=True))]
                ),
            )
        )
        body += " turn_tail"
    rules.append(("root", f"(({body}))"))
    return join_rules(rules)


def _is_basic(rule: str) -> bool:
    """xgrammar's built-in JSON rules: their masks are cached across grammars in their own
    context, so their gaps are left alone."""
    return rule.startswith("basic_")


@contextmanager
def _readable_errors() -> Iterator[None]:
    """xgrammar reports schema problems as RuntimeError with a C++ location prefix: strip it."""
    try:
        yield
    except RuntimeError as err:
        message = _CPP_LOCATION.sub("", str(err).strip().splitlines()[-1])
        raise ValueError(f"xgrammar cannot compile the tools: {message}") from None


class XGrammarMatcher(EngineMatcher):
    def __init__(self, matcher: xgr.GrammarMatcher, strings_repeat: bool = False) -> None:
        self.inner = matcher
        self.strings_repeat = strings_repeat

    def accept_token(self, token_id: int) -> bool:
        return bool(self.inner.accept_token(token_id))

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        return bool(self.inner.fill_next_token_bitmask(bitmask, row))

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return bool(self.inner.is_terminated())

    def can_end(self) -> bool:
        return bool(self.inner.is_completed())

    def direct(self) -> Direct:
        handle = self.inner._handle  # the native matcher behind xgrammar's Python class
        return handle.accept_token, handle.fill_next_token_bitmask, handle.rollback

    def fill_rows(self, bitmask: torch.Tensor) -> Callable[[int, bool], bool]:
        """The native fill bound to ``bitmask`` as xgrammar's FFI tensor (:func:`_ffi_view`)."""
        return partial(self.inner._handle.fill_next_token_bitmask, _ffi_view(bitmask))

    @property
    def batchable(self) -> Any:
        """The xgrammar matcher's FFI handle: the batched calls take it (:func:`batch_fill`)."""
        return self.inner._handle


@lru_cache(maxsize=1)
def _ffi_view(bitmask: torch.Tensor) -> Any:
    """``bitmask`` as xgrammar's FFI tensor. A torch tensor is converted through DLPack on every
    native call, a fifth of a fill inside a string (``benchmarks/README.md``); the view shares its
    memory and keeps it alive. vLLM fills one bitmask for its life, so the last view is kept
    (tensors hash by identity) and each row's first fill converts nothing."""
    return tvm_ffi.from_dlpack(bitmask)


class XGrammarGrammar(EngineGrammar):
    def __init__(self, compiled: xgr.CompiledGrammar, strings_repeat: bool = False) -> None:
        self.compiled = compiled
        self.strings_repeat = strings_repeat
        """:attr:`EngineMatcher.strings_repeat` of its matchers (:func:`strings_repeat`)."""

    @property
    def memory_bytes(self) -> int:
        return int(self.compiled.memory_size_bytes * RESIDENT_PER_COUNTED_BYTE)

    def matcher(self, stop_token_ids: Sequence[int]) -> XGrammarMatcher:
        matcher = xgr.GrammarMatcher(self.compiled, override_stop_tokens=list(stop_token_ids))
        return XGrammarMatcher(matcher, self.strings_repeat)


_BOUNDING = frozenset({"minLength", "maxLength", "pattern", "format", "enum", "const", "uniqueItems"})
"""Keywords under which a string's mask changes as plain characters are written (a count, a
pattern's state, a literal), or that put a guard beside the engine."""


def strings_repeat(turn: TurnSpec) -> bool:
    """Whether inside the turn's calls a mask allowing every plain string token can only stand
    inside unbounded string values (:attr:`EngineMatcher.strings_repeat`).

    JSON's syntax puts a position inside a key or inside a value whatever the schema. A value
    string under no length, pattern, format or literal is a loop whose rest is the same after any
    plain characters; every other value accepts only its own characters (numbers, literals,
    whitespace). A key is a fixed name where every object names its keys (strict mode, no
    ``additionalProperties`` or ``patternProperties``), and such a key's mask allows no more
    tokens than its characters (:data:`KEY_CHARACTERS_MAX`). A schema without a type (any JSON
    value) brings objects of free keys beside others: refused, as is anything this walk does not
    know."""
    keys = 0
    for tool in turn.tools:
        for _, schema in iter_subschemas(canonical_value(tool.parameters)):
            if not _BOUNDING.isdisjoint(schema) or "patternProperties" in schema or "propertyNames" in schema:
                return False
            if schema.get("additionalProperties", False) is not False:
                return False
            if "type" not in schema and not ({"anyOf", "oneOf", "allOf", "$ref"} & schema.keys()):
                return False
            if "object" in _types(schema) and "properties" not in schema:
                return False
            if "array" in _types(schema) and not isinstance(schema.get("items"), dict):
                return False
            keys += sum(len(name) for name in schema.get("properties") or {})
    return keys <= KEY_CHARACTERS_MAX


def _types(schema: dict[str, Any]) -> tuple[str, ...]:
    kind = schema.get("type")
    return (kind,) if isinstance(kind, str) else tuple(kind) if isinstance(kind, list) else ()


def _refuse_raw_patterns(turn: TurnSpec) -> None:
    """xgrammar matches a ``pattern`` against the raw JSON text of the string: a quote or a
    backslash the pattern names is written unescaped (``{"n": ""q"}`` for ``^"q$``), which is
    invalid JSON. Its classes, ranges and ``.`` leave both out, so only named ones are refused."""
    for tool in turn.written:
        for path, sub in iter_subschemas(tool.parameters):
            pattern = sub.get("pattern")
            raw = literal_characters(pattern) & {'"', "\\"} if isinstance(pattern, str) else set()
            if raw:
                where = pointer(("parameters", *path, "pattern"))
                raise ValueError(
                    f"tool {tool.name!r}: {where}: the xgrammar engine cannot compile this: the "
                    f"pattern names {sorted(raw)[0]!r}, which xgrammar writes into the JSON string "
                    "unescaped (invalid JSON); HERMES_VLLM_ENGINE=auto or llguidance compiles it"
                )


def _placeholder_call(turn: TurnSpec) -> list[Rule]:
    """``turn_call`` as one literal call: what the composed matcher's grammars are told of a call
    (its name and arguments are checked by the head automaton and the tool's grammar)."""
    d = turn.dialect
    return [("turn_call", f"(({_literal(d.tool_call.begin + PLACEHOLDER + d.tool_call.end)}))")]


def head_ebnf(turn: TurnSpec) -> str:
    """The composed matcher's head grammar: the turn with each call the placeholder."""
    return turn_ebnf(turn, call=_placeholder_call(turn))


def tool_ebnf(turn: TurnSpec) -> str:
    """The composed matcher's grammar of ``turn``'s one tool: the call from its arguments on
    (after the arguments' colon), then what may follow a call, later calls the placeholder."""
    basics: dict[str, str] = {}
    rules = _arguments_rules(0, turn.tools[0].parameters, turn.max_whitespace, basics)
    call = [*rules, *basics.items(), *_placeholder_call(turn)]
    end = _literal(turn.dialect.tool_call.end)
    return turn_ebnf(turn, call=call, after_call=lambda gap: f'{gap} t0_root {gap} "}}" {gap} {end}')


class XGrammarEngine(GrammarEngine):
    name = "xgrammar"
    supported_keywords = XGRAMMAR_KEYWORDS
    answers = True

    def __init__(self, vocab: Vocabulary) -> None:
        super().__init__(vocab)
        limits = get_limits()
        # Our cache (keyed by the canonical turn) holds whole grammars; xgrammar's own cache is on
        # for what ours cannot share: the token masks of rules that recur across different tool
        # sets and key orders: a new tool set compiles faster with it (docs/architecture.md,
        # "Measurements behind the code").
        self._compiler = xgr.GrammarCompiler(
            vocab.tokenizer_info,
            max_threads=limits.compile_threads,
            cache_enabled=limits.xgrammar_cache_bytes > 0,
            cache_limit_bytes=max(1, limits.xgrammar_cache_bytes // XGRAMMAR_CACHE_UNDERCOUNT),
        )
        self._heads: dict[tuple[str, str, bool, int], xgr.CompiledGrammar] = {}
        """The composed matcher's head grammars: a few per dialect, shared by every tool set."""
        self._tools: GrammarCache[xgr.CompiledGrammar] = GrammarCache(
            limits.cache_bytes,
            limits.compile_threads,
            lambda g: int(g.memory_size_bytes * RESIDENT_PER_COUNTED_BYTE),
        )
        """The composed matcher's per-tool grammars, by the tool's schema (not its name)."""
        if limits.compose_min_tools > 0:
            sort_ahead(vocab)

    def warm(self, turn: TurnSpec) -> None:
        """A first compile's setup (the JSON basics' masks into xgrammar's cache), and the composed
        matcher's sorted vocabulary built here rather than in the background: what start-up
        builds, the engine's frozen heap keeps."""
        self.compile(turn)
        if get_limits().compose_min_tools > 0:
            sorted_vocabulary(self.vocab)

    @classmethod
    def check(cls, turn: TurnSpec) -> None:
        _refuse_raw_patterns(turn)
        with _readable_errors():
            xgr.Grammar.from_ebnf(turn_ebnf(turn))

    def compile(self, turn: TurnSpec) -> XGrammarGrammar | ComposedGrammar:
        _refuse_raw_patterns(turn)
        if composable(turn, self.vocab, get_limits().compose_min_tools):
            return self._composed(turn)
        return XGrammarGrammar(self._compile_ebnf(turn_ebnf(turn)), strings_repeat(turn))

    def _compile_ebnf(self, ebnf: str) -> xgr.CompiledGrammar:
        with _readable_errors():
            grammar = xgr.Grammar.from_ebnf(merge_equal_rules(fold_gaps(ebnf, _is_basic), _is_basic))
            return self._compiler.compile_grammar(grammar)

    def _composed(self, turn: TurnSpec) -> ComposedGrammar:
        """Many tools: the shared head grammar now, each tool's grammar when its name is written."""
        with _readable_errors():  # a tool xgrammar refuses is refused now, as a whole grammar's compile does
            for spec in turn.tools:
                _schema_rules(
                    json.dumps(canonical_value(spec.parameters), ensure_ascii=False), turn.max_whitespace
                )
        head_key = (turn.dialect.name, turn.mode, turn.parallel, turn.max_whitespace)
        if head_key not in self._heads:
            self._heads[head_key] = self._compile_ebnf(head_ebnf(turn))
        keys: dict[int, tuple[str, str, bool, int]] = {}

        def tool(index: int) -> Future[xgr.CompiledGrammar]:
            one = TurnSpec(turn.dialect, (turn.tools[index],), "auto", turn.parallel, turn.max_whitespace)
            if index not in keys:
                schema = canonical_json(one.tools[0].parameters)
                keys[index] = (schema, turn.dialect.name, turn.parallel, turn.max_whitespace)
            return self._tools.get(keys[index], lambda: self._compile_ebnf(tool_ebnf(one)))

        return ComposedGrammar(
            turn, self.vocab, self._heads[head_key], tool, lambda: self._compile_ebnf(turn_ebnf(turn))
        )

    def fill_bitmasks(
        self, matchers: Sequence[EngineMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        inner = batch_inner(matchers)
        if inner is None:
            super().fill_bitmasks(matchers, bitmask, rows)
            return
        batch_fill([m._handle for m in inner], bitmask, list(rows))


@cache
def _fill_pool() -> xgr.BatchGrammarMatcher:
    """The process's one batch filler, with as many threads as vLLM's own bitmask pool (half the
    CPUs, 1 to 8): at least two cost more CPU than one on a two-core host for the same masks
    (benchmarks/README.md)."""
    return xgr.BatchGrammarMatcher(max_threads=max(1, min((os.cpu_count() or 2) // 2, 8)))


def batch_fill(handles: list[Any], bitmask: torch.Tensor, rows: list[int]) -> None:
    """Fill ``bitmask[rows[i]]`` from the matcher whose FFI handle is ``handles[i]``
    (:attr:`XGrammarMatcher.batchable`), all in one call on the fill pool's threads.

    Called on xgrammar's FFI directly, as :func:`batch_accept`: its Python wrapper reads each
    matcher's handle through a property, a list built again on every step."""
    _fill_pool()._handle.batch_fill_next_token_bitmask(handles, bitmask, rows, False)


def batch_accept(handles: list[Any], tokens: list[int]) -> list[int]:
    """``accept_token(tokens[i])`` on the matcher whose FFI handle is ``handles[i]`` for every i,
    in one call: the indices refused.

    Called on xgrammar's FFI directly: its Python wrapper reads the answer one element at a time
    (a quarter of the call's cost at 256 rows); here one lookup says whether any was refused."""
    accepted = _core.BatchGrammarMatcher.batch_accept_token(handles, tokens, False)
    return [i for i, ok in enumerate(accepted) if not ok] if 0 in accepted else []
