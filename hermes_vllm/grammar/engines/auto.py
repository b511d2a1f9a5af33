"""The default engine: xgrammar, with llguidance for the turns xgrammar handles badly.

xgrammar has the fastest masks, but (xgrammar 0.2.8; the compile times in docs/architecture.md,
"Engines"):

- it precomputes masks for every position of a length-bounded string, so its compile grows with
  the bound (seconds on a 131k vocabulary; llguidance's stays in milliseconds);
- a string with ``minLength``, ``maxLength`` or ``pattern`` admits no JSON escape, so a valid value
  holding a quote, a backslash or a newline cannot be written (tests/test_grammar_soundness.py);
- it cannot enforce some keywords llguidance can (``patternProperties``, an ``allOf`` or ``oneOf``
  the schema rewrites cannot turn into something simpler);
- its pattern for an e-mail address leaves quoted local parts out (``"joe bloggs"@example.com``:
  see :data:`hermes_vllm.schema.formats.RAW_SAFE_PATTERNS`), and the patterns with long counted
  repeats compile slowly for the same reason as a length bound (a ``hostname``, labels of up to
  63 characters, and a ``uri``; the other formats compile as fast on either).

A turn whose tools hold one of these is compiled by llguidance, every other turn by xgrammar.
Both accept the same turn language, so a batch may mix them.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import torch

from hermes_vllm.grammar.engines.base import EngineGrammar, EngineMatcher, GrammarEngine
from hermes_vllm.grammar.engines.composed import ComposedMatcher
from hermes_vllm.grammar.engines.llguidance import LLGUIDANCE_KEYWORDS, LLGuidanceEngine
from hermes_vllm.grammar.engines.xgrammar import XGRAMMAR_KEYWORDS, XGrammarEngine, XGrammarMatcher
from hermes_vllm.schema import CONSTRAINING, iter_subschemas
from hermes_vllm.schema.formats import FORMAT_PATTERNS, RAW_SAFE_PATTERNS
from hermes_vllm.schema.spec import pointer
from hermes_vllm.turn import TurnSpec
from hermes_vllm.vocabulary import Vocabulary

_BOUNDED_STRINGS = frozenset({"minLength", "maxLength", "pattern"})
_LLGUIDANCE_FORMATS = frozenset(
    {"hostname", "uri", *(f for f, p in FORMAT_PATTERNS.items() if RAW_SAFE_PATTERNS[f] != p)}
)
"""Formats whose pattern xgrammar compiles slowly or narrower than the format (see above)."""


def prefers_llguidance(turn: TurnSpec) -> bool:
    """Whether ``turn`` holds a bounded string or a keyword only llguidance enforces."""
    for tool in turn.written:
        for _, sub in iter_subschemas(tool.parameters):
            if sub.get("format") in _LLGUIDANCE_FORMATS:
                return True
            for key in sub:
                if key in _BOUNDED_STRINGS or (key in CONSTRAINING and key not in XGRAMMAR_KEYWORDS):
                    return True
    return False


def _refuse_multiples(turn: TurnSpec) -> None:
    """A turn llguidance compiles keeps no ``multipleOf`` (1.7 rejects negative multiples)."""
    for tool in turn.written:
        for path, sub in iter_subschemas(tool.parameters):
            if "multipleOf" in sub:
                where = pointer(("parameters", *path, "multipleOf"))
                raise ValueError(
                    f"tool {tool.name!r}: {where}: 'multipleOf' is enforced on xgrammar only, and this turn "
                    "needs llguidance (a pattern, format or string length, or a keyword only it enforces)"
                )


class AutoEngine(GrammarEngine):
    name = "auto"
    supported_keywords = XGRAMMAR_KEYWORDS | LLGUIDANCE_KEYWORDS
    answers = True

    def __init__(self, vocab: Vocabulary) -> None:
        super().__init__(vocab)
        self.xgrammar = XGrammarEngine(vocab)

    @cached_property
    def llguidance(self) -> LLGuidanceEngine:
        """Built on first use: most servers never need it."""
        return LLGuidanceEngine(self.vocab)

    @classmethod
    def check(cls, turn: TurnSpec) -> None:
        if prefers_llguidance(turn):
            _refuse_multiples(turn)
            LLGuidanceEngine.check(turn)
        else:
            XGrammarEngine.check(turn)

    def warm(self, turn: TurnSpec) -> None:
        """xgrammar's setup; llguidance's (its token trie) stays on its first use, which most
        servers never meet."""
        self.xgrammar.warm(turn)

    def compile(self, turn: TurnSpec) -> EngineGrammar:
        if prefers_llguidance(turn):
            _refuse_multiples(turn)
            return self.llguidance.compile(turn)
        return self.xgrammar.compile(turn)

    def fill_bitmasks(
        self, matchers: Sequence[EngineMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        # xgrammar's rows in one batch: plain ones, and composed ones whose mask is an xgrammar
        # matcher's as it is (``ComposedMatcher.inner``); the others one by one.
        batched = [
            isinstance(m, XGrammarMatcher) or (isinstance(m, ComposedMatcher) and m.inner is not None)
            for m in matchers
        ]
        fast = [(m, r) for m, r, b in zip(matchers, rows, batched, strict=True) if b]
        if fast:
            self.xgrammar.fill_bitmasks([m for m, _ in fast], bitmask, [r for _, r in fast])
        for matcher, row, b in zip(matchers, rows, batched, strict=True):
            if not b:
                matcher.fill_bitmask(bitmask, row)
