"""Optional engine: llguidance (Earley parser over lazily built regex lexemes; no vocabulary precompute).

The turn is one Lark grammar, the same language as the xgrammar grammar:

- free text is the terminal ``TEXT``: any text containing no call tag and no span opener, written
  with llguidance's regex negation (``/(?s:.*)/ & ~(/(?s:.*)/ ("<tool_call>" | ...) /(?s:.*)/)``);
- each tag is a ``[lazy]`` lexeme ``TEXT "<tag>"``, which ends at the first occurrence of the tag;
  lexemes are matched on bytes, so a tag split over tokens, or one token holding a tag's end and
  the JSON's start, needs nothing special;
- a reasoning/hidden span is its opener then the lazy lexeme ``/(?s:.*)/ "</tag>"`` (opaque: a call
  tag inside is text); an unclosed span may end the output (``/(?s:.*)/`` minus the closing tag);
- a call is ``HEAD %json{arguments} TAIL`` per tool (and per key order), with the bounded call
  whitespace written into ``HEAD``/``TAIL``; objects that declare ``properties`` are closed (our
  argument policy; llguidance, like JSON Schema, would leave them open);
- a turn with a final answer (:func:`_answer_turn`) has no free text: reasoning spans, then calls
  or the answer as ``%json{answer}``, then only whitespace; the answer's strings hold no tag's
  first character (:func:`_answer_schema`).

``no_forcing`` is set: by default llguidance lets the mask allow only the tokenizer's canonical
tokenization of forced text, which depends on the tokenizer's ``encode`` (SentencePiece adds a
space) and differs from xgrammar's mask, which allows every tokenization of the language.

Known differences from xgrammar, all inside the arguments JSON (llguidance 1.7, the version vLLM
pins): (1) whitespace is allowed, up to the bound, around ``,`` and ``:`` only, not after ``{``/``[``
or before ``}``/``]`` (1.7 repeats ``whitespace_pattern`` without bound; the separators are the
only bounded place); compact and ``{"a": 1, "b": 2}`` layouts are accepted. (2) A string spells
each character one way: printable characters raw (no ``\\uXXXX``, no ``\\/``), DEL only as
``\\u007f``; so an answer's strings cannot hold a tag's first character at all (xgrammar escapes
it). Special tokens are text here as in xgrammar (the token table is the one xgrammar
decodes); stop tokens end the output only where the grammar may end. llguidance does not report
its memory use: ``memory_bytes`` is the grammar text's size, a lower bound.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import llguidance as llg
import torch

from hermes_vllm.dialect import TagPair
from hermes_vllm.grammar.engines.base import (
    EngineGrammar,
    EngineMatcher,
    GrammarEngine,
    set_token_allowed,
)
from hermes_vllm.grammar.turn import LEAD_WHITESPACE, TurnShape, tag_initials, turn_shape
from hermes_vllm.schema import ToolSchemaError, ToolSpec, canonical_value, iter_subschemas
from hermes_vllm.schema.formats import formats_as_patterns
from hermes_vllm.schema.names import as_pattern_properties
from hermes_vllm.schema.spec import pointer
from hermes_vllm.schema.unique import without_kept_unique
from hermes_vllm.turn import ANSWER_NAME, MARK, TurnSpec
from hermes_vllm.vocabulary import Vocabulary

logger = logging.getLogger(__name__)

# Measured on the JSON-Schema-Test-Suite (draft 2020-12) through the real compiler with every
# keyword let through: llguidance enforces these wherever it compiles them, and refuses with an
# error (never silently) what it cannot: patternProperties that are not disjoint, oneOf not
# provably exclusive, min/maxProperties beside optional properties, false subschemas. Left out:
# multipleOf (1.7 rejects negative multiples, fixed in 1.8) and what 1.7 reports as unimplemented
# (uniqueItems, not, if/then/else, contains, dependent*, propertyNames, unevaluated*,
# $dynamicRef): strict coverage refuses them, lenient coverage strips them. propertyNames in the
# one shape schema.names serves is compiled as the patternProperties entry it means.
LLGUIDANCE_KEYWORDS = frozenset(
    {
        "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
        "minProperties", "maxProperties", "items", "prefixItems", "minItems", "maxItems",
        "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "anyOf", "allOf", "oneOf", "$ref", "$defs", "definitions", "propertyNames",
    }
)  # fmt: skip

_ANY = "/(?s:.*)/"


def _lit(text: str) -> str:
    """A Lark string literal (JSON escapes, ASCII only)."""
    return json.dumps(text)


def _ws(n: int) -> str:
    return f"/[ \\t\\n\\r]{{0,{n}}}/"


def _not_containing(words: Sequence[str]) -> str:
    """A terminal for any text that contains none of ``words`` (llguidance's ``&``/``~``)."""
    return f"{_ANY} & ~({_ANY} ({' | '.join(_lit(w) for w in words)}) {_ANY})"


def _json_options(max_ws: int) -> dict[str, Any]:
    """Bounded whitespace around separators only: llguidance 1.7 repeats ``whitespace_pattern``."""
    ws = f"[ \\t\\n\\r]{{0,{max_ws}}}"
    return {"whitespace_flexible": False, "item_separator": f"{ws},{ws}", "key_separator": f"{ws}:{ws}"}


_OPENERS = frozenset({"additionalProperties", "patternProperties", "unevaluatedProperties"})


def _schema(tool: ToolSpec, max_ws: int) -> dict[str, Any]:
    """The arguments schema as llguidance takes it, with whitespace options.

    Integral floats become integers (llguidance refuses a ``maxItems`` of ``2.0``; JSON Schema
    compares numbers by value), and objects that declare ``properties`` are closed unless they
    say otherwise: our argument policy, which llguidance (following JSON Schema) would not apply.
    A served ``propertyNames`` becomes its ``patternProperties`` entry (:mod:`~hermes_vllm.schema.names`).
    """
    schema: dict[str, Any] = canonical_value(formats_as_patterns(without_kept_unique(tool.parameters)))
    for _, sub in list(iter_subschemas(schema)):
        as_pattern_properties(sub)
        if isinstance(sub.get("properties"), dict) and not _OPENERS & sub.keys():
            sub["additionalProperties"] = False
    return {**schema, "x-guidance": _json_options(max_ws)}


def _call_rules(i: int, tool: ToolSpec, order: str, end: str, max_ws: int) -> list[str]:
    """``{"name": N, "arguments": ARGS}`` (or arguments first) up to the closing tag."""
    ws = _ws(max_ws)
    name = _lit(json.dumps(tool.name, ensure_ascii=False))
    schema = json.dumps(_schema(tool, max_ws))
    key = {k: f"{_lit(json.dumps(k))} {ws} {_lit(':')} {ws}" for k in ("name", "arguments")}
    close = f"{ws} {_lit('}')} {ws} {_lit(end)}"
    if order == "name_first":
        head = f"{ws} {_lit('{')} {ws} {key['name']} {name} {ws} {_lit(',')} {ws} {key['arguments']}"
        tail = close
    else:
        head = f"{ws} {_lit('{')} {ws} {key['arguments']}"
        tail = f"{ws} {_lit(',')} {ws} {key['name']} {name} {close}"
    rule = f"tool{i}_{order}"
    upper = rule.upper()
    return [
        f"{rule}: {upper}_HEAD %json {schema} {upper}_TAIL",
        f"{upper}_HEAD: {head}",
        f"{upper}_TAIL: {tail}",
    ]


_COMBINATORS = frozenset({"$ref", "anyOf", "oneOf", "allOf", "enum", "const"})


def _answer_schema(turn: TurnSpec, answer: ToolSpec) -> dict[str, Any]:
    """The final answer's schema as llguidance takes it (:func:`_schema`), its strings holding no
    tag's first character (a ``pattern`` each, intersected with the string's own).

    llguidance spells each character one way, so such a character cannot be written at all (under
    xgrammar it is written ``\\u003c``). What no pattern reaches is refused: object keys beyond
    the declared properties (llguidance 1.7 leaves ``propertyNames`` unimplemented) and untyped
    values (any JSON, strings and keys inside included)."""
    schema = _schema(answer, turn.max_whitespace)
    no_tag = {"pattern": f"^[^{tag_initials(turn.dialect)}]*$"}

    def refuse(path: tuple[str | int, ...], what: str) -> ValueError:
        where = pointer(("parameters", *path))
        return ToolSchemaError(
            ANSWER_NAME, where, f"{what}: llguidance keeps tags out of an answer's strings through their "
            "schemas only; declare the object's properties and type every value, or use "
            "HERMES_VLLM_ENGINE=xgrammar",
        )  # fmt: skip

    for path, sub in list(iter_subschemas(schema)):
        types = sub.get("type")
        kinds = {types} if isinstance(types, str) else set(types or ())
        narrows = path[-2:-1] == ("allOf",)  # a constraint on its parent's value, not a value itself
        if not kinds and not narrows and not _COMBINATORS & sub.keys():
            raise refuse(path, "an untyped value (any JSON)")
        if "object" in kinds and (
            sub.get("additionalProperties", True) is not False or "patternProperties" in sub
        ):
            raise refuse(path, "an object with keys of any spelling")
        if "array" in kinds and sub.get("items", True) is True:
            raise refuse(path, "an array of untyped items")
        if "string" in kinds and not {"enum", "const"} & sub.keys():
            sub["allOf"] = [*sub.get("allOf", ()), no_tag]
    return schema


def _answer_turn(turn: TurnSpec, shape: TurnShape, lines: list[str]) -> str:
    """The start rule of a turn with an answer (:class:`TurnShape`), the same language as
    xgrammar's. Adds the answer's rules to ``lines``."""
    spans = turn.dialect.free_spans
    lines += [f"TRAIL: {_ws(LEAD_WHITESPACE)}", f"MARK: {_lit(MARK)}"]
    calls = "CALL_LEAD body (CALL_LEAD body)*" if shape.calls == "any" else "CALL_LEAD body"
    endings = shape.endings
    if "calls" in endings:
        lines.append(f"calls: {calls} MARK?")
    if "answer" in endings and turn.answer is not None:
        lines.append(f"answer: TRAIL %json {json.dumps(_answer_schema(turn, turn.answer))}")
    leads = " | ".join(f"SPAN{k}_LEAD span{k}_rest" for k in range(len(spans)))
    prefix = f"({leads})* " if spans else ""
    return f"{prefix}({' | '.join(endings)}) TRAIL"


def build_lark(turn: TurnSpec) -> str:
    """The whole turn as one llguidance Lark grammar (see the module docstring for the shape)."""
    d = turn.dialect
    shape = turn_shape(turn)
    spans: tuple[TagPair, ...] = d.free_spans
    call = d.tool_call
    lines = [
        '%llguidance {"no_forcing": true}',
        f"TEXT: {_not_containing([call.begin, *(p.begin for p in spans)])}",
    ]
    for k, p in enumerate(spans):
        lines += [
            f"span{k}_open[lazy]: TEXT {_lit(p.begin)}",
            f"span{k}_rest[lazy]: {_ANY} {_lit(p.end)}",
            f"SPAN{k}_UNCLOSED: {_not_containing([p.end])}",
            f"SPAN{k}_LEAD: {_ws(LEAD_WHITESPACE)} {_lit(p.begin)}",
        ]
    span = " | ".join(f"span{k}_open span{k}_rest" for k in range(len(spans)))
    end = " | ".join(["TEXT", *(f"span{k}_open SPAN{k}_UNCLOSED" for k in range(len(spans)))])
    lines += [f"end: {end}"] + ([f"span: {span}"] if spans else [])
    free = "span*" if spans else ""
    if shape.may_call:
        orders = ("name_first", "arguments_first") if d.key_order == "either" else (d.key_order,)
        bodies = [(i, t, o) for o in orders for i, t in enumerate(turn.tools)]
        lines += [
            f"call_open[lazy]: TEXT {_lit(call.begin)}",
            f"CALL_LEAD: {_ws(LEAD_WHITESPACE)} {_lit(call.begin)}",
            "call: call_open body",
            "body: " + " | ".join(f"tool{i}_{o}" for i, _, o in bodies),
        ]
        for i, tool, order in bodies:
            lines += _call_rules(i, tool, order, call.end, turn.max_whitespace)
    with_calls = "(span | call)*" if spans else "call*"
    if shape.endings:
        start = _answer_turn(turn, shape, lines)
    elif shape.opens_with_call:
        leads = " | ".join(f"SPAN{k}_LEAD span{k}_rest" for k in range(len(spans)))
        prefix = f"({leads})* " if spans else ""
        start = f"{prefix}CALL_LEAD body {with_calls if shape.calls == 'any' else free} end"
    elif shape.calls == "one":
        start = f"{free} (call {free})? end"
    else:
        start = f"{with_calls if shape.calls == 'any' else free} end"
    return "\n".join([lines[0], f"start: {start}", *lines[1:]]) + "\n"


def _grammar(turn: TurnSpec) -> str:
    return str(llg.LLMatcher.grammar_from_lark(build_lark(turn)))


_POSITION = re.compile(r"^at \d+\(\d+\): ")


def _compile_error(turn: TurnSpec, message: str) -> ValueError:
    """A readable error naming the tool: llguidance reports a Lark position and grammar excerpt."""
    for tool in turn.written:
        grammar = llg.LLMatcher.grammar_from_json_schema(_schema(tool, turn.max_whitespace))
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
        if is_error:
            return ValueError(f"tool {tool.name!r}: llguidance cannot compile its parameters: {messages[0]}")
    return ValueError(f"llguidance cannot compile the tools: {_POSITION.sub('', message.splitlines()[0])}")


class _TokenTable:
    """The token bytes xgrammar decoded, in the shape ``llguidance.TokenizerWrapper`` reads.

    Sharing xgrammar's table makes every engine see the same bytes per token; only stop tokens
    are special (never text).
    """

    def __init__(self, vocab: Vocabulary) -> None:
        self.eos_token_id = vocab.stop_token_ids[0]
        self.bos_token_id = None
        self.tokens = vocab.decoded
        self.special_token_ids = list(vocab.stop_token_ids)
        self._tokenizer = vocab.tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._tokenizer.encode(text, add_special_tokens=False))


class LLGuidanceMatcher(EngineMatcher):
    """An ``LLMatcher`` plus the request's stop tokens, which end the output where it may end."""

    def __init__(self, inner: llg.LLMatcher, stops: frozenset[int], native_stops: frozenset[int]) -> None:
        self.inner = inner
        self._stops = stops
        # Stop bits to rewrite after each fill, unless they are exactly llguidance's own EOS set.
        self._fix = sorted(stops | native_stops) if stops != native_stops else []
        self._terminated = False

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id in self._stops:
            self._terminated = bool(self.inner.is_accepting())
            return self._terminated
        return bool(self.inner.try_consume_tokens([token_id]) == 1)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        words = bitmask.shape[1]
        self.inner.unsafe_compute_mask_ptr(bitmask.data_ptr() + row * bitmask.stride(0) * 4, words * 4)
        self.fix_stops(bitmask, row)
        return True

    def fix_stops(self, bitmask: torch.Tensor, row: int) -> None:
        """Allow exactly this request's stop tokens, and only where the output may end."""
        if not self._fix:
            return
        accepting = not self._terminated and bool(self.inner.is_accepting())
        for token in self._fix:
            set_token_allowed(bitmask, row, token, accepting and token in self._stops)

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._terminated:
            self._terminated = False
            num_tokens -= 1
        if num_tokens:
            self.inner.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self._terminated

    def can_end(self) -> bool:
        return self._terminated or bool(self.inner.is_accepting())


class LLGuidanceGrammar(EngineGrammar):
    """A checked grammar and a pristine matcher; request matchers are cheap deep copies of it."""

    def __init__(self, grammar: str, prototype: llg.LLMatcher, native_stops: frozenset[int]) -> None:
        self.grammar = grammar
        self._prototype = prototype
        self._native_stops = native_stops

    @property
    def memory_bytes(self) -> int:
        return len(self.grammar)

    def matcher(self, stop_token_ids: Sequence[int]) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(self._prototype.deep_copy(), frozenset(stop_token_ids), self._native_stops)


class LLGuidanceEngine(GrammarEngine):
    name = "llguidance"
    supported_keywords = LLGUIDANCE_KEYWORDS
    answers = True

    def __init__(self, vocab: Vocabulary) -> None:
        super().__init__(vocab)
        self._native_stops = frozenset(vocab.stop_token_ids)

    @cached_property
    def tokenizer(self) -> llg.LLTokenizer:
        """llguidance's token trie (about a second for 131k tokens), built on first compile."""
        wrapper = llg.TokenizerWrapper(_TokenTable(self.vocab))
        return llg.LLTokenizer(
            wrapper, n_vocab=self.vocab.vocab_size, eos_token=list(self.vocab.stop_token_ids)
        )

    def warm(self, turn: TurnSpec) -> None:
        """The token trie, at start-up rather than on the first compile."""
        _ = self.tokenizer

    @cached_property
    def _executor(self) -> llg.LLExecutor:
        return llg.LLExecutor(num_threads=max(2, (os.cpu_count() or 2) // 2))

    @classmethod
    def check(cls, turn: TurnSpec) -> None:
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(_grammar(turn))
        if is_error:
            raise _compile_error(turn, messages[0])

    def compile(self, turn: TurnSpec) -> LLGuidanceGrammar:
        grammar = _grammar(turn)
        prototype = llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if prototype.is_error():
            raise _compile_error(turn, prototype.get_error())
        for warning in prototype.get_grammar_warnings():
            logger.debug("llguidance: %s", warning)
        return LLGuidanceGrammar(grammar, prototype, self._native_stops)

    def fill_bitmasks(
        self, matchers: Sequence[EngineMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        ours = [m for m in matchers if isinstance(m, LLGuidanceMatcher)]
        if len(ours) != len(matchers) or not bitmask.is_contiguous():
            super().fill_bitmasks(matchers, bitmask, rows)
            return
        pairs = [(m.inner, row) for m, row in zip(ours, rows, strict=True)]
        self._executor.unsafe_compute_mask_ptr(
            pairs, bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0]
        )
        for m, row in zip(ours, rows, strict=True):
            m.fix_stops(bitmask, row)
