"""Optional engine: outlines-core (one regex per turn, compiled to a token-level DFA index).

The turn is one regular expression, the same language as the xgrammar grammar: free text
is "any text containing no call tag and no span opener" (see :func:`avoiding`: Rust regexes have
no negation), each span is its opener, text without its closing tag, and the closing tag; a call
is the call tag, one ``{"name": N, "arguments": ARGS}`` per tool and key order with ``ARGS`` from
``outlines_core.json_schema.build_regex_from_schema``, and the closing tag. The regex runs on
bytes, so token boundaries (a tag split over tokens, a token holding a tag's end and the JSON's
start) need nothing special.

Limitations of outlines-core 0.2.14 (the version vLLM pins), measured on the JSON-Schema-Test-Suite
and BFCL; strict coverage refuses the keywords, :meth:`OutlinesEngine.check` the placements:

- **Compile cost.** The index maps every DFA state to every token it allows, so a compile takes
  a second or more on a 32k vocabulary, several on 131k, and the index megabytes (every
  free-text and JSON-string state allows nearly the whole vocabulary). Compiles run on the
  compile pool under ``Limits.compile_timeout_s``.
- **Blow-ups.** Counted repetition is unrolled into DFA states: ``maxLength`` (and ``minLength``)
  on strings and large ``minItems``/``maxItems`` can exhaust time and memory, and so can open
  JSON (any-value, open object or array subschemas unroll three levels deep: indexes of hundreds of
  megabytes, gigabytes for one suite schema; docs/architecture.md, "Measurements behind the
  code"). The string bounds are not supported, and
  ``check`` refuses them, item bounds above ``MAX_ITEMS_BOUND`` and turn regexes longer than
  ``MAX_REGEX_CHARS`` before a compile starts, so no request can occupy a compile thread (or
  gigabytes) with one.
- **Dropped keywords.** Numeric bounds (``minimum``, ``maximum``, ``exclusiveMinimum``,
  ``exclusiveMaximum``, ``multipleOf``) are silently ignored by outlines-core, as are
  ``additionalProperties`` beside ``properties`` (the object is closed) and all but one type of a
  type list beside object/array keywords: the bounds are not supported (strict coverage refuses,
  lenient validates calls after generation); ``check`` refuses the other two.
  ``prefixItems`` only as a closed tuple (``minItems`` its length, ``items: false``, how
  ``schema.rewrite.structure_of`` spells an array ``const``): outlines-core requires every prefix
  item and ignores ``items``, so ``check`` refuses open ones. ``allOf`` and ``oneOf`` are not supported, nor
  ``pattern``: outlines-core pastes it into the JSON string unescaped, so a pattern that can match
  a quote lets the model write invalid JSON, and an unanchored one (``b``, which JSON Schema
  searches for) made an index of gigabytes.
- **Keys.** outlines-core has no ``propertyNames``: a ``format`` on the names of a free-form
  object (``dict[datetime.date, V]``) is spelled by :func:`_regex_with_names`; a pattern or a
  length there is refused like one on a value.
- **JSON it cannot spell.** Strings admit no ``\\uXXXX`` escape and no U+007F..U+009F character;
  property names that need escapes are refused; a number's exponent needs a sign (``1e+5``);
  whitespace (bounded) is allowed everywhere xgrammar allows it except before ``,`` in arrays;
  any-value subschemas (``{}``, ``true``) nest at most three levels.
- **End marker.** 0.2.14 drops every token that leaves a position where the regex could end for
  one where it cannot (fixed upstream after 0.2.14, commit 2ba0b24): in a turn, where free text
  may end anywhere, that is every call and span tag. So the regex ends with an explicit marker,
  U+10FFFF (a Unicode noncharacter), indexed as the first stop token: a stop token is allowed
  exactly where the marker is, i.e. where the turn may end. Free text never contains U+10FFFF;
  a model that spells it with byte tokens where the turn may end can only stop there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

import outlines_core as oc
import torch
from outlines_core.json_schema import build_regex_from_schema

from hermes_vllm.grammar.engines.base import EngineGrammar, EngineMatcher, GrammarEngine, set_token_allowed
from hermes_vllm.grammar.turn import LEAD_WHITESPACE, turn_shape
from hermes_vllm.schema import CONSTRAINING, ToolSpec, canonical_value, iter_subschemas
from hermes_vllm.schema.formats import formats_as_patterns
from hermes_vllm.schema.names import free_names
from hermes_vllm.schema.spec import pointer
from hermes_vllm.schema.unique import without_kept_unique
from hermes_vllm.turn import TurnSpec

logger = logging.getLogger(__name__)

# Measured on the JSON-Schema-Test-Suite (draft 2020-12) through the real compiler: with these
# (and check's refusals) every valid instance that compiles is accepted and every invalid one
# rejected; see the module docstring for what is left out and why.
OUTLINES_KEYWORDS = frozenset(
    {
        "type", "enum", "const", "properties", "required", "additionalProperties",
        "items", "prefixItems", "minItems", "maxItems", "anyOf", "$ref", "$defs", "definitions",
        "propertyNames",
    }
)  # fmt: skip
MAX_ITEMS_BOUND = 64
"""Largest ``minItems``/``maxItems`` compiled; each unit of bound copies the item's DFA."""
MAX_REGEX_CHARS = 40_000
"""Longest turn regex compiled. The index grows with it; the bound admits BFCL's tool sets up to
their 99th percentile, and each any-value or open object/array subschema adds tens of thousands of
characters, as outlines unrolls them three levels deep (docs/architecture.md, "Measurements
behind the code")."""
_BLOW_UPS = {
    "maxLength": "it unrolls into one DFA state per character",
    "minLength": "it unrolls into one DFA state per character",
    "pattern": "outlines-core writes it into the JSON string unescaped (a pattern that can match a quote "
    "lets the model end the string early) and an unanchored one explodes the DFA (1.8 GB for 'b')",
}
_META = frozenset("\\.+*?()|[]{}^$#&-~/")
_ANY = {"type": ["array", "boolean", "null", "number", "object", "string"]}
END = "\U0010ffff"
"""Marks where the turn may end (see the module docstring); never part of free text."""


def _escape(text: str) -> str:
    """``text`` as a literal in Rust regex syntax (``<``/``>`` must stay unescaped there)."""
    return "".join(f"\\{c}" if c in _META else c for c in text)


def _ascii_class(excluded: set[str]) -> str:
    """The ASCII characters not in ``excluded``, as ranges (empty string when none is left)."""
    codes = [c for c in range(128) if chr(c) not in excluded]
    ranges: list[list[int]] = []
    for c in codes:
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    body = "".join(f"\\x{a:02X}" if a == b else f"\\x{a:02X}-\\x{b:02X}" for a, b in ranges)
    return f"[{body}]" if body else ""


_NON_ASCII = f"[^\\x00-\\x7F{END}]"


def _alt(parts: Sequence[str]) -> str:
    """Union of the non-empty regexes, grouped so that it concatenates safely ("" if none)."""
    unique = list(dict.fromkeys(p for p in parts if p))
    if len(unique) <= 1:
        return "".join(unique)
    return f"(?:{'|'.join(unique)})"


def avoiding(words: Sequence[str]) -> str:
    """A regex for any text that contains none of ``words`` (nor :data:`END`).

    outlines-core does not minimise its DFA, and a token may end inside a multi-byte character,
    so the regex is shaped for a small DFA: every input position has one place in it, and all
    non-ASCII characters are read at one place (their partial-UTF-8 states are shared). Over the
    trie of ``words`` with first characters ``F``, text is
    ``(?:[ASCII-F] | K* (?:M | [non-ASCII]))* K*``, where an excursion ``M`` into the trie ends by
    reading an ASCII character that leaves it, and ``K`` ends right before an ``F`` character, a
    non-ASCII one or the end. That needs ASCII words whose first character never recurs inside a
    word (true of every built-in dialect's tags); other tag sets are refused.
    """
    words = [w for w in dict.fromkeys(words) if w]
    firsts = {w[0] for w in words}
    if any(c in firsts for w in words for c in w[1:]) or not all(w.isascii() for w in words):
        raise ValueError(
            f"the outlines engine needs ASCII tags whose first character does not recur: {words}"
        )
    prefixes = {w[:i] for w in words for i in range(1, len(w) + 1)}

    def children(node: str) -> list[str]:
        return sorted({p[-1] for p in prefixes if len(p) == len(node) + 1 and p.startswith(node)})

    def leave(node: str) -> str:  # M: reads on until an ASCII character leaves the trie
        kids = children(node)
        deeper = [_escape(c) + leave(node + c) for c in kids if node + c not in words]
        return _alt([*deeper, _ascii_class({*firsts, *kids})])

    def stop(node: str) -> str:  # K: stops before an F character, a non-ASCII one or the end
        deeper = [_escape(c) + stop(node + c) for c in children(node) if node + c not in words]
        return f"(?:{_alt(deeper)})?" if deeper else ""

    live = [f for f in sorted(firsts) if f not in words]
    text = _ascii_class(firsts)
    if not live:
        return f"(?:{_alt([text, _NON_ASCII])})*"
    m = _alt([_escape(f) + leave(f) for f in live])
    k = f"(?:{_alt([_escape(f) + stop(f) for f in live])})*"
    return f"(?:{_alt([text, k + _alt([m, _NON_ASCII])])})*{k}"


def _ws(n: int) -> str:
    return f"[ \\t\\n\\r]{{0,{n}}}"


_STRING = build_regex_from_schema(json.dumps({"type": "string"}))
"""outlines-core's regex of any JSON string: what it writes for each key of a free-form object."""
_SENTINEL = "hermesvllmnames{}"
"""A placeholder ``const`` outlines-core writes as it is (letters and digits: nothing escaped)."""


def _regex_with_names(schema: Any, ws: str) -> str:
    """outlines-core's regex of ``schema`` (after :func:`_for_outlines`), each object whose keys a
    format bounds (:func:`~hermes_vllm.schema.names.free_names`; the format already its raw-safe
    pattern) spelled by us: outlines-core has no ``propertyNames``, so such an object stands in as
    a placeholder ``const``, and its regex is outlines-core's own for the free-form object with
    each key's string regex replaced by the names pattern (anchors dropped: it is pasted inside the
    quotes, which the raw-safe patterns allow)."""
    found: list[tuple[str, str]] = []
    for _, sub in list(iter_subschemas(schema)):
        names = free_names(sub)
        if names is None or set(names) - {"type", "pattern"} or not isinstance(names.get("pattern"), str):
            continue
        marker = _SENTINEL.format(len(found))
        value = sub.get("additionalProperties", True)
        template = build_regex_from_schema(
            json.dumps({"type": "object", "additionalProperties": {"const": marker}}), ws
        )
        value_regex = _regex_with_names(dict(_ANY) if _any_value(value) else value, ws)
        key = '"(?:' + names["pattern"].removeprefix("^").removesuffix("$") + ')"'
        found.append((marker, template.replace(_STRING, key).replace(f'"{marker}"', f"(?:{value_regex})")))
        sub.clear()
        sub["const"] = marker
    regex: str = build_regex_from_schema(json.dumps(schema), ws)
    for marker, object_regex in reversed(found):
        regex = regex.replace(f'"{marker}"', f"(?:{object_regex})")
    return regex


def _call_body(tool: ToolSpec, order: str, max_ws: int) -> str:
    """``{"name": N, "arguments": ARGS}`` (or arguments first) with bounded whitespace."""
    ws = _ws(max_ws)
    schema = _for_outlines(formats_as_patterns(without_kept_unique(tool.parameters), raw_safe=True))
    args = _regex_with_names(schema, ws)
    name = f'"name"{ws}:{ws}{_escape(json.dumps(tool.name, ensure_ascii=False))}'
    if order == "name_first":
        return f'\\{{{ws}{name}{ws},{ws}"arguments"{ws}:{ws}(?:{args}){ws}\\}}'
    return f'\\{{{ws}"arguments"{ws}:{ws}(?:{args}){ws},{ws}{name}{ws}\\}}'


def build_regex(turn: TurnSpec) -> str:
    """The whole turn as one regex, then :data:`END` (see the module docstring for the shape)."""
    return f"(?:{_turn_regex(turn)}){_escape(END)}"


def _turn_regex(turn: TurnSpec) -> str:
    d = turn.dialect
    ws = _ws(turn.max_whitespace)
    text = avoiding([d.tool_call.begin, *(p.begin for p in d.free_spans)])
    spans = _alt([f"{_escape(p.begin)}{avoiding([p.end])}{_escape(p.end)}" for p in d.free_spans])
    tail = (
        f"(?:{_alt([f'{_escape(p.begin)}{avoiding([p.end])}' for p in d.free_spans])})?"
        if d.free_spans
        else ""
    )
    free = f"{text}(?:{spans}{text})*" if spans else text
    # outlines-core writes no answer: the engine refuses a turn that may end with one, and writes
    # a turn whose answer goes unused (``required``) as the turn without it.
    shape = turn_shape(replace(turn, answer=None))
    if not shape.may_call:
        return free + tail
    orders = ("name_first", "arguments_first") if d.key_order == "either" else (d.key_order,)
    bodies = _alt([_call_body(t, o, turn.max_whitespace) for o in orders for t in turn.tools])
    call = f"{_escape(d.tool_call.begin)}{ws}{bodies}{ws}{_escape(d.tool_call.end)}"
    free_calls = f"{text}(?:{_alt([call, spans])}{text})*"
    after = free_calls if shape.calls == "any" else free
    if shape.opens_with_call:
        lead_ws = _ws(LEAD_WHITESPACE)
        lead = f"(?:{lead_ws}{spans})*" if spans else ""
        return f"{lead}{lead_ws}{call}{after}{tail}"
    if shape.calls == "one":
        return f"{free}(?:{call}{free})?{tail}"
    return after + tail


_CONTAINER_KEYWORDS = frozenset(
    {"properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems"}
)


def _refusal(sub: dict[str, Any]) -> str | None:
    """Why outlines-core would compile ``sub`` wrongly (or blow up), or None."""
    blow_up = next((k for k in _BLOW_UPS if k in sub), None)
    if blow_up is not None:
        return f"{blow_up!r}: {_BLOW_UPS[blow_up]}"
    for key in ("minItems", "maxItems"):
        bound = sub.get(key)
        if isinstance(bound, (int, float)) and bound > MAX_ITEMS_BOUND:
            return f"{key!r} {bound} exceeds the outlines engine's limit of {MAX_ITEMS_BOUND}"
    prefix = sub.get("prefixItems")
    if isinstance(prefix, list) and not (sub.get("items") is False and sub.get("minItems") == len(prefix)):
        return (
            "'prefixItems' other than a closed tuple (minItems its length, items false): "
            "outlines-core requires every prefix item and ignores 'items'"
        )
    extra = sub.get("additionalProperties", False)
    if "properties" in sub and extra is not False:
        return "'additionalProperties' beside 'properties' is ignored by outlines-core (it closes the object)"
    if "propertyNames" in sub and any(
        "$ref" in s for _, s in iter_subschemas(sub.get("additionalProperties"))
    ):
        return (
            "'propertyNames' beside values holding a '$ref' (the outlines engine spells such an object alone)"
        )
    escaped = [n for n in sub.get("properties", {}) if json.dumps(n, ensure_ascii=False)[1:-1] != n]
    if escaped:
        return f"'properties' name {escaped[0]!r} needs JSON escapes, which outlines-core does not write"
    kinds = sub.get("type")
    if isinstance(kinds, list) and len(kinds) > 1 and _CONTAINER_KEYWORDS & sub.keys():
        return "'type' lists more than one type beside object/array keywords (outlines-core keeps one)"
    return None


def _check_tool(tool: ToolSpec) -> None:
    for path, sub in iter_subschemas(tool.parameters):
        why = _refusal(sub)
        if why is not None:
            where = pointer(("parameters", *path))
            raise ValueError(f"tool {tool.name!r}: {where}: the outlines engine cannot compile this: {why}")


def _any_value(schema: Any) -> bool:
    return schema is True or (
        isinstance(schema, dict) and not (CONSTRAINING - {"$defs", "definitions"}) & schema.keys()
    )


def _for_outlines(schema: Any) -> Any:
    """Rewrites outlines-core 0.2.14 needs, each exact: integral floats as integers (it spells
    ``const: -2.0`` as ``-2.0`` only), and an any-value subschema (``{}`` or ``true``, which it
    compiles to an unbracketed alternation or refuses) as the list of all six types.
    """
    if isinstance(schema, list):
        return [_for_outlines(s) for s in schema]
    if not isinstance(schema, dict):
        return canonical_value(schema)

    def sub(value: Any) -> Any:
        return dict(_ANY) if _any_value(value) else _for_outlines(value)

    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {k: sub(v) for k, v in value.items()}
        elif key == "anyOf" and isinstance(value, list):
            out[key] = [sub(v) for v in value]
        elif (key == "items" and value is not False) or (
            key == "additionalProperties" and isinstance(value, dict)
        ):
            out[key] = sub(value)
        else:
            out[key] = _for_outlines(value)
    return out


def _checked_regex(turn: TurnSpec) -> str:
    """The turn's regex, after refusing what outlines-core would compile wrongly or blow up on."""
    for tool in turn.tools:
        _check_tool(tool)
    try:
        regex = build_regex(turn)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"outlines-core cannot compile the tools: {str(err).splitlines()[0].strip()}"
        ) from None
    if len(regex) > MAX_REGEX_CHARS:
        raise ValueError(
            f"the tools make a {len(regex)}-character regex, over the outlines engine's limit of "
            f"{MAX_REGEX_CHARS} (its index would take hundreds of MB); any-value and open object/array "
            "parameters cost the most"
        )
    return regex


class OutlinesMatcher(EngineMatcher):
    """A ``Guide`` plus the token history (rollback past the guide's own window replays it).

    The index allows the end marker's token id (the first stop token) exactly where the turn
    may end; the request's stop tokens follow that bit.
    """

    def __init__(self, grammar: OutlinesGrammar, stops: frozenset[int]) -> None:
        self._guide = oc.Guide(grammar.index)
        self._end = grammar.end_token
        self._stops = stops
        self._stop_bits = sorted(stops | {self._end})
        # Whether the stop bits differ from the marker's bit that outlines-core writes.
        self._own_stops = stops != {self._end}
        self._scratch = torch.zeros((1, grammar.mask_words), dtype=torch.int32)
        self._history: list[int] = []
        self._terminated = False

    def accept_token(self, token_id: int) -> bool:
        if self._terminated:
            return False
        if token_id in self._stops:
            self._terminated = self.can_end()
            return self._terminated
        try:
            self._guide.advance(token_id, return_tokens=False)
        except ValueError:
            return False
        self._history.append(token_id)
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        words = bitmask.shape[1]
        if words >= self._scratch.shape[1]:
            self._guide.write_mask_into(bitmask.data_ptr() + row * bitmask.stride(0) * 4, words, 4)
        else:  # the index counts one id more than the logits have (the marker's): write aside
            self._guide.write_mask_into(self._scratch.data_ptr(), self._scratch.shape[1], 4)
            bitmask[row].copy_(self._scratch[0, :words])
        if self._own_stops or self._guide.is_finished():
            end = self.can_end() and not self._terminated
            for token in self._stop_bits:
                set_token_allowed(bitmask, row, token, end and token in self._stops)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens and self._terminated:
            self._terminated = False
            num_tokens -= 1
        if not num_tokens:
            return
        del self._history[-num_tokens:]
        if num_tokens <= self._guide.get_allowed_rollback():
            self._guide.rollback_state(num_tokens)
            return
        self._guide.reset()
        for token in self._history:
            self._guide.advance(token, return_tokens=False)

    def is_terminated(self) -> bool:
        return self._terminated

    def can_end(self) -> bool:
        # is_finished: past a marker spelled with byte tokens, where only stopping is left.
        return self._terminated or bool(self._guide.accepts_tokens([self._end]) or self._guide.is_finished())


class OutlinesGrammar(EngineGrammar):
    def __init__(self, index: oc.Index, end_token: int, mask_words: int) -> None:
        self.index = index
        self.end_token = end_token
        self.mask_words = mask_words

    @cached_property
    def memory_bytes(self) -> int:
        """The index's serialised size (outlines-core reports no in-memory size)."""
        _, (binary,) = self.index.__reduce__()
        return len(binary)

    def matcher(self, stop_token_ids: Sequence[int]) -> OutlinesMatcher:
        return OutlinesMatcher(self, frozenset(stop_token_ids))


class OutlinesEngine(GrammarEngine):
    name = "outlines"
    supported_keywords = OUTLINES_KEYWORDS

    @cached_property
    def vocabulary(self) -> oc.Vocabulary:
        """Token bytes as xgrammar decodes them, plus the end marker as the first stop token.

        Stop and empty (padding) tokens are never text; the EOS id outlines-core requires is one
        past the logits, where the index only puts it after the marker.
        """
        stops = set(self.vocab.stop_token_ids)
        table: dict[bytes, list[int]] = {END.encode(): [self.vocab.stop_token_ids[0]]}
        for token_id, data in enumerate(self.vocab.decoded):
            if data and token_id not in stops:
                table.setdefault(data, []).append(token_id)
        return oc.Vocabulary(self.vocab.vocab_size, table)

    @classmethod
    def check(cls, turn: TurnSpec) -> None:
        _checked_regex(turn)

    def compile(self, turn: TurnSpec) -> OutlinesGrammar:
        regex = _checked_regex(turn)
        try:
            index = oc.Index(regex, self.vocabulary)
        except (ValueError, RuntimeError) as err:
            raise ValueError(f"outlines-core cannot compile the tools: {str(err).splitlines()[0]}") from None
        return OutlinesGrammar(index, self.vocab.stop_token_ids[0], (len(self.vocabulary) + 31) // 32)
