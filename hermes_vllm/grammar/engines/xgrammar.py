"""The default engine: xgrammar structural tags (the fastest masks inside calls).

The turn is one structural tag: free text that holds no tag's begin, the call and span tags after
it (robust to any token boundary, since xgrammar matches the tag text byte by byte), a JSON-schema
call body, and an optional unclosed reasoning/hidden span at the end so that free text and
reasoning may stop anywhere. The tag is lowered to EBNF and rewritten before compiling
(:mod:`.ebnf`): xgrammar's JSON and free-text rules merged (it gives every tool's schema its own
copy of the JSON rules), and each whitespace gap folded into the element after it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import xgrammar as xgr
from xgrammar import structural_tag as st

from hermes_vllm.dialect import TagPair
from hermes_vllm.grammar.engines.base import EngineGrammar, EngineMatcher, GrammarEngine, Vocabulary
from hermes_vllm.grammar.engines.ebnf import dedupe_rules, fold_gaps
from hermes_vllm.grammar.turn import LEAD_WHITESPACE, TurnSpec
from hermes_vllm.settings import get_limits

# Measured on the JSON-Schema-Test-Suite (benchmarks/soundness.py): xgrammar enforces these once
# schema.make_explicit has spelled out types and defaults, and schema.uncovered_keywords refuses
# them where they sit beside '$ref'/'anyOf' or combine 'pattern' with lengths. Left out because
# xgrammar silently ignores or mis-enforces them: uniqueItems, not, if/then/else, oneOf/allOf
# (unless rewritten), dependent*, contains, propertyNames, unevaluated*; multipleOf (ignored
# except for type integer with an integer divisor <= 1024); patternProperties (patterns taken as
# whole-key matches, '^'/'$' break them, and beside 'properties' no key is accepted at all).
XGRAMMAR_KEYWORDS = frozenset(
    {
        "type", "enum", "const", "properties", "required", "additionalProperties",
        "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern",
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf",
        "$ref", "$defs", "definitions", "minProperties", "maxProperties",
    }
)  # fmt: skip


_CPP_LOCATION = re.compile(r"^.*?\.cc:\d+: ")

# Measured with benchmarks/memory.py --mode compile (131k vocabulary, BFCL tool sets, RSS after
# malloc_trim): a cached grammar keeps 1.3x what ``memory_size_bytes`` counts (allocator overhead
# of its many small mask vectors) when it churns alone and ~1.7x beside xgrammar's churning cache,
# and xgrammar's own cache keeps ~3.1x what ``get_cache_size_bytes`` says. Our byte limits mean
# resident memory, so both counts are scaled, with a margin.
RESIDENT_PER_COUNTED_BYTE = 2.0
XGRAMMAR_CACHE_UNDERCOUNT = 4


def _ws(n: int) -> str:
    return f"[ \\t\\n\\r]{{0,{n}}}"


def _call(turn: TurnSpec, ws: str) -> st.SequenceFormat:
    """The call tag around ``{"name": NAME, "arguments": ARGS}`` (or arguments first), any tool.

    The text shared by all tools (the brace and the first key) is written once, so a tool set of
    n tools adds n small branches rather than n copies of the call's head. No part ends in
    whitespace: each gap is its own element with another after it, so :func:`.ebnf.fold_gaps`
    can join it to that element.
    """
    d = turn.dialect
    gap = st.RegexFormat(pattern=ws)
    orders = ("name_first", "arguments_first") if d.key_order == "either" else (d.key_order,)
    branches = []
    for order in orders:
        per_tool: list[Any] = []
        for tool in turn.tools:
            name = re.escape(json.dumps(tool.name, ensure_ascii=False))
            args = st.JSONSchemaFormat(json_schema=tool.parameters, max_whitespace_cnt=turn.max_whitespace)
            if order == "name_first":
                head = st.RegexFormat(pattern=rf'{name}{ws},{ws}"arguments"{ws}:')
                per_tool.append(st.SequenceFormat(elements=[head, gap, args]))
            else:
                tail = st.RegexFormat(pattern=rf'{ws},{ws}"name"{ws}:{ws}{name}')
                per_tool.append(st.SequenceFormat(elements=[args, tail]))
        key = "name" if order == "name_first" else "arguments"
        branches.append(
            st.SequenceFormat(
                elements=[st.RegexFormat(pattern=rf'"{key}"{ws}:'), gap, st.OrFormat(elements=per_tool)]
            )
        )
    either: Any = branches[0] if len(branches) == 1 else st.OrFormat(elements=branches)
    return st.SequenceFormat(
        elements=[
            st.ConstStringFormat(value=d.tool_call.begin), gap, st.RegexFormat(pattern=r"\{"), gap, either,
            gap, st.RegexFormat(pattern=r"\}"), gap, st.ConstStringFormat(value=d.tool_call.end),
        ]
    )  # fmt: skip


def build_structural_tag(turn: TurnSpec) -> st.StructuralTag:
    """The whole turn as one xgrammar structural tag (see the module docstring for the shape)."""
    d = turn.dialect
    call = _call(turn, _ws(turn.max_whitespace))
    spans = [st.TagFormat(begin=p.begin, content=st.AnyTextFormat(), end=p.end) for p in d.free_spans]

    # Free text is text holding no tag's begin, then tags each followed by such text. Spelled
    # this way rather than as xgrammar's TriggeredTagsFormat, the text rule is the same for every
    # tool set, so xgrammar's cache keeps its token masks: a new tool set compiles ~30% faster.
    text = st.AnyTextFormat(excludes=[d.tool_call.begin, *(p.begin for p in d.free_spans)])

    def free_text(with_calls: bool) -> Any:
        tags = ([call] if with_calls else []) + spans
        if not tags:
            return text
        tag_then_text = st.SequenceFormat(elements=[st.OrFormat(elements=tags), text])
        return st.SequenceFormat(elements=[text, st.StarFormat(content=tag_then_text)])

    def open_span(p: TagPair) -> st.SequenceFormat:
        return st.SequenceFormat(
            elements=[st.ConstStringFormat(value=p.begin), st.AnyTextFormat(excludes=[p.end])]
        )

    tail: list[Any] = (
        [st.OptionalFormat(content=st.OrFormat(elements=[open_span(p) for p in d.free_spans]))]
        if spans
        else []
    )
    body: list[Any]
    if turn.mode == "none":
        body = [free_text(False)]
    elif turn.mode == "auto" and turn.parallel:
        body = [free_text(True)]
    elif turn.mode == "auto":
        body = [
            free_text(False),
            st.OptionalFormat(content=st.SequenceFormat(elements=[call, free_text(False)])),
        ]
    else:
        lead = st.RegexFormat(pattern=_ws(LEAD_WHITESPACE))
        prefix: list[Any] = [lead]
        if spans:
            prefix = [
                st.StarFormat(content=st.SequenceFormat(elements=[lead, st.OrFormat(elements=spans)])),
                lead,
            ]
        body = [*prefix, call, free_text(turn.parallel)]
    return st.StructuralTag(format=st.SequenceFormat(elements=body + tail))


def _is_basic(rule: str) -> bool:
    """xgrammar's built-in JSON rules: their masks are cached across grammars in their own
    context, so their gaps are left alone."""
    return rule.startswith("basic_")


def _worth_merging(rule: str) -> bool:
    """xgrammar's built-in JSON rules, copied into every schema (~370 KiB of masks each on a 131k
    vocabulary), and its free-text rules. Merging every equal rule would compile faster still, but
    xgrammar's masks inside calls run ~2x slower once the rules of distinct whitespace gaps are
    one rule followed by many contexts."""
    return rule.startswith(("basic_", "any_text"))


@contextmanager
def _readable_errors() -> Iterator[None]:
    """xgrammar reports schema problems as RuntimeError with a C++ location prefix: strip it."""
    try:
        yield
    except RuntimeError as err:
        message = _CPP_LOCATION.sub("", str(err).strip().splitlines()[-1])
        raise ValueError(f"xgrammar cannot compile the tools: {message}") from None


class XGrammarMatcher(EngineMatcher):
    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self.inner = matcher

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


class XGrammarGrammar(EngineGrammar):
    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self.compiled = compiled

    @property
    def memory_bytes(self) -> int:
        return int(self.compiled.memory_size_bytes * RESIDENT_PER_COUNTED_BYTE)

    def matcher(self, stop_token_ids: Sequence[int]) -> XGrammarMatcher:
        return XGrammarMatcher(xgr.GrammarMatcher(self.compiled, override_stop_tokens=list(stop_token_ids)))


class XGrammarEngine(GrammarEngine):
    name = "xgrammar"
    supported_keywords = XGRAMMAR_KEYWORDS

    def __init__(self, vocab: Vocabulary) -> None:
        super().__init__(vocab)
        limits = get_limits()
        # Our cache (keyed by the canonical turn) holds whole grammars; xgrammar's own cache is on
        # for what ours cannot share: the token masks of rules that recur across different tool
        # sets and key orders. A new tool set compiles ~2.5x faster with it (131k vocabulary).
        self._compiler = xgr.GrammarCompiler(
            vocab.tokenizer_info,
            max_threads=limits.compile_threads,
            cache_enabled=limits.xgrammar_cache_bytes > 0,
            cache_limit_bytes=max(1, limits.xgrammar_cache_bytes // XGRAMMAR_CACHE_UNDERCOUNT),
        )
        self._batch = xgr.BatchGrammarMatcher(max_threads=max(2, (os.cpu_count() or 2) // 2))

    @classmethod
    def check(cls, turn: TurnSpec) -> None:
        with _readable_errors():
            xgr.Grammar.from_structural_tag(build_structural_tag(turn))

    def compile(self, turn: TurnSpec) -> XGrammarGrammar:
        with _readable_errors():
            ebnf = str(xgr.Grammar.from_structural_tag(build_structural_tag(turn)))
            ebnf = fold_gaps(dedupe_rules(ebnf, "root", _worth_merging), _is_basic)
            return XGrammarGrammar(self._compiler.compile_grammar(xgr.Grammar.from_ebnf(ebnf)))

    def fill_bitmasks(
        self, matchers: Sequence[EngineMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        inner = [m.inner for m in matchers if isinstance(m, XGrammarMatcher)]
        if len(inner) != len(matchers):
            super().fill_bitmasks(matchers, bitmask, rows)
            return
        self._batch.batch_fill_next_token_bitmask(inner, bitmask, list(rows))
