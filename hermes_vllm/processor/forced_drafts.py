"""Grammar drafts: the tokens a constrained row's grammar forces next, offered as its drafts.

Inside a call long runs are forced: the envelope ``{"name": "get_weather", "arguments": {"`` under
a named tool, the keys of a strict schema, closing brackets, the end tag. Without drafts each
forced token costs an engine step. Under speculative decoding vLLM verifies ``k`` drafted tokens
in one step, and a hosted row (:mod:`~hermes_vllm.processor.hosted`) is where vLLM trims drafts:
so after the proposer drafted, a row whose grammar forces what comes next gets that run as its
drafts (:func:`install` wraps the scheduler's ``update_draft_token_ids``), up to ``k``, in place
of the proposer's unless the proposer's drafts already begin with it.

*Forced* is decided on the row's own masks (gate, engine, budget, stop strings: what the target is
masked with), engine-agnostically: a walk on a copy of the row fills the mask at each position;
where every allowed token's bytes share a prefix, that prefix is forced, and where a token spells
exactly that prefix the walk takes it and goes on. It ends at the first branch, a stop token, or
the first position where everything is allowed.

*Past a gap.* Whitespace the grammar allows between a call's tokens (``max_call_whitespace``)
makes every gap a branch, and forced runs would end at each. Where a branch allows only whitespace
and then one forced run, the walk takes the whitespace the dialect's template writes in that gap
(:func:`template_gaps`, read off every dialect's formatted call: a newline after the call's tag, a
space after ``:`` and ``,``, nothing elsewhere) and goes on. That part is a guess, not forced: the
target verifies it as it does any draft (greedy output stays the output without drafts), and a
model that spaces its calls otherwise refuses it.

*Spelled as the model spells it.* A byte-forced run has several tokenizations, and the target
keeps a draft only where it is the token the model itself would write there. So the run is
spelled by the served tokenizer, in context (the row's last tokens before it, since SentencePiece
spells a word at a text's start differently), and only from a token boundary that spelling puts
where the row's text already has one. Its end is held back where the text after the run could
merge with it: a token whose bytes to the run's end begin a longer vocabulary token, and any
token whose boundary moves when the run is spelled again followed by a continuation the grammar
allows (or a few probe characters where too many are allowed to list). Where every position
allows exactly one token, the run is those tokens (no spelling question). Every offered token is
then checked on the row's masks, position by position: a grammar draft is never one the target's
mask refuses, and greedy output is the output without drafts (the mask decides, not the drafts).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hermes_vllm.dialect import available_dialects, get_dialect
from hermes_vllm.formats.blocks import call_block
from hermes_vllm.grammar.engines.base import token_allowed
from hermes_vllm.grammar.engines.head import SortedVocabulary
from hermes_vllm.latin1 import whole_characters
from hermes_vllm.memo import TextKeyed
from hermes_vllm.settings import get_limits
from hermes_vllm.vllm_api import touchpoints, wrap_attribute

logger = logging.getLogger(__name__)

MAX_ALLOWED = 256
"""A mask allowing more tokens than this is not read for a forced run (free text, a value)."""
MAX_WALK = 64
"""Mask fills one offer may spend finding the forced bytes."""
RUN_BYTES_PER_DRAFT = 12
"""Forced bytes looked for per draft wanted (a forced token is rarely longer)."""
PROBES = (b"a", b"A", b"0", b" ", b'"', b"_", b",", b"}", b"\n", b"<")
"""Continuations a held-back check tries where the grammar allows too many tokens to list."""
SPELLED_BYTES = 1 << 18
"""Text of the spellings kept (rows calling the same tools spell the same runs), then emptied."""
MAX_CONTINUATIONS = 12
"""Distinct continuations (by first byte) a held-back check tries from the branch's mask."""


GAP_BYTES = b" \t\n\r"
"""The whitespace a call's gaps may hold (JSON's)."""


STRUCTURAL = frozenset(b'{}[]<>,:"/')
"""Bytes that name the gap before them; any other byte begins a value (a number, ``true``...)."""


def gap_key(before: int, after: int) -> tuple[int, int]:
    """A gap's key in :func:`template_gaps`: the byte before it, and the first byte after it or
    ``-1`` where that begins a bare value."""
    return before, after if after in STRUCTURAL else -1


@functools.cache
def template_gaps() -> dict[tuple[int, int], bytes]:
    """The whitespace every dialect's template writes in a call's gaps (by :func:`gap_key`), read
    off each dialect's formatted call of arguments holding every kind of JSON value after a key
    and in an array (no whitespace inside a string). A gap not found there is written empty."""
    sample = {"s": "x", "n": -1, "a": [1, 2, "y", [3], {"k": False}], "o": {"t": True, "z": None}}
    gaps: dict[tuple[int, int], bytes] = {}
    for name in available_dialects():
        text = call_block("f", sample, get_dialect(name)).encode()
        i = 1
        while i < len(text):
            j = i
            while j < len(text) and text[j] in GAP_BYTES:
                j += 1
            if j > i and j < len(text):
                gaps[gap_key(text[i - 1], text[j])] = text[i:j]
            i = max(j, i + 1)
    return gaps


class Walk(Protocol):
    """A copy of a row that a walk may advance and put back."""

    def mask(self) -> np.ndarray | None:
        """The packed mask (int32 words) at this position; ``None`` where every token is allowed."""

    def accept(self, token: int) -> bool:
        """Advance by one token (after :meth:`mask` at this position); False if refused."""

    def restart(self) -> None:
        """Back to the position the walk began at."""


@dataclass(frozen=True, slots=True)
class Run:
    """What a walk found: the forced bytes, the tokens taken, how it ended."""

    forced: bytes
    singles: bool
    """Every position on the way allowed exactly one token: ``path`` is the only spelling."""
    path: tuple[int, ...]
    end: int | None
    """The stop token the run ends with, where the grammar allows only it after the run."""
    after: tuple[bytes, ...] | None
    """What may follow the run (the branch's allowed tokens' bytes); ``None``: too many to list."""


def _allowed(words: np.ndarray) -> list[int] | None:
    """The token ids a packed row allows; ``None`` where they are too many to force anything."""
    nonzero = np.flatnonzero(words)
    if nonzero.size > MAX_ALLOWED:
        return None
    out: list[int] = []
    for index in nonzero.tolist():
        word = int(words[index]) & 0xFFFFFFFF
        base = index << 5
        while word:
            low = word & -word
            out.append(base + low.bit_length() - 1)
            word ^= low
        if len(out) > MAX_ALLOWED:
            return None
    return out


def _common_prefix(pieces: Sequence[bytes]) -> bytes:
    """The bytes every piece begins with."""
    first, last = min(pieces), max(pieces)  # the sorted extremes share what all share
    n = 0
    while n < len(first) and first[n] == last[n]:
        n += 1
    return first[:n]


class ForcedDrafts:
    """Finds and spells forced runs for one vocabulary (one per engine process's core)."""

    def __init__(
        self,
        tokenizer: Any,
        decoded: Sequence[bytes],
        stop_ids: Sequence[int],
        sorted_vocab: SortedVocabulary,
    ) -> None:
        self._tokenizer = tokenizer
        self._decoded = decoded
        self._stops = frozenset(stop_ids)
        self._sorted = sorted_vocab
        backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's own, unbatched
        self._encode: Callable[[str], list[int]] = (
            (lambda text: backend.encode(text, add_special_tokens=False).ids)
            if backend is not None
            else (lambda text: list(tokenizer.encode(text, add_special_tokens=False)))
        )
        self._spelled: TextKeyed[tuple[bytes, bytes, tuple[bytes, ...] | None], tuple[int, ...]] = TextKeyed(
            SPELLED_BYTES
        )

    def offer(self, walk: Walk, history: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens forced from the walk's position, spelled as the model would after
        ``history`` (the row's last tokens), each allowed by the row's mask at its position.
        The walk is left advanced: the caller puts the row back."""
        if limit <= 0:
            return []
        before = self._decoded[history[-1]][-1:] if history else b""
        run = self.find(walk, limit, before[0] if before else -1)
        if run.singles:
            tokens = list(run.path)
        elif run.forced:
            tokens = self.spell(run.forced, history, run.after)
        else:
            tokens = []
        if run.end is not None and b"".join(self._decoded[t] for t in tokens) == run.forced:
            tokens.append(run.end)
        tokens = tokens[:limit]
        if run.singles or not tokens:
            return tokens
        walk.restart()
        return self._checked(walk, tokens)

    def find(self, walk: Walk, limit: int, before: int = -1) -> Run:
        """Walk the forced bytes from the walk's position (see the module's docstring); ``before``
        is the last byte of the row's text (``-1``: none)."""
        forced = b""
        path: list[int] = []
        singles = True
        end: int | None = None
        after: tuple[bytes, ...] | None = None
        wanted = RUN_BYTES_PER_DRAFT * (limit + 1)
        for _ in range(MAX_WALK):
            words = walk.mask()
            allowed = None if words is None else _allowed(words)
            if not allowed:
                break
            if self._stops.intersection(allowed):
                if len(allowed) == 1:
                    end = allowed[0]
                break
            pieces = [self._decoded[t] for t in allowed]
            prefix = _common_prefix(pieces)
            if not prefix:
                gap = _template_gap(allowed, pieces, forced[-1] if forced else before)
                if gap is None:
                    after = tuple(dict.fromkeys(pieces))
                    break
                allowed, pieces = gap
                prefix = _common_prefix(pieces)
                singles = False
            exact = next((t for t, p in zip(allowed, pieces, strict=True) if len(p) == len(prefix)), None)
            forced += prefix
            singles = singles and len(allowed) == 1
            if exact is None or not walk.accept(exact):
                break
            path.append(exact)
            if (singles and len(path) >= limit) or len(forced) >= wanted:
                break
        return Run(forced, singles and bool(path), tuple(path), end, after)

    def spell(self, forced: bytes, history: Sequence[int], after: tuple[bytes, ...] | None) -> list[int]:
        """``forced`` in the served tokenizer's tokens after ``history``, its unstable end held back;
        empty where the tokenizer puts no boundary where the row's text has one. The run and each
        continuation are spelled in one batch call of the tokenizer."""
        whole = forced[: whole_characters(forced)]
        anchor = b"".join(self._decoded[t] for t in history[-2:])
        key = (anchor, whole, after)
        found = self._spelled.get(key)
        if found is None:
            found = self._spelled.keep(
                key, (anchor + whole).decode("latin-1"), tuple(self._spell(anchor, whole, after))
            )
        return list(found)

    def _spell(self, anchor: bytes, whole: bytes, after: tuple[bytes, ...] | None) -> list[int]:
        texts = [anchor + whole, *(anchor + whole + c for c in self._continuations(after))]
        try:
            spellings = [self._encode(text.decode("utf-8")) for text in texts]
        except UnicodeDecodeError:
            return []
        spelled = self._after(anchor, whole, spellings[0])
        if spelled is None:
            return []
        tokens, starts = spelled
        keep = len(tokens)
        while keep and self._extendable(whole[starts[keep - 1] :], last=keep == len(tokens)):
            keep -= 1
        for text, ids in zip(texts[1:], spellings[1:], strict=True):
            other = self._after(anchor, text[len(anchor) :], ids)
            keep = 0 if other is None else min(keep, _shared(tokens, other[0]))
        return tokens[:keep]

    def _after(self, anchor: bytes, text: bytes, ids: Sequence[int]) -> tuple[list[int], list[int]] | None:
        """The tokens of ``ids`` (the tokenizer's spelling of ``anchor + text``) that spell
        ``text``, and each one's offset in it; ``None`` where no token begins where ``text`` does."""
        pieces = [self._decoded[t] for t in ids]
        joined = b"".join(pieces)
        lead = len(joined) - len(anchor) - len(text)
        if lead not in (0, 1) or not joined.endswith(anchor + text):  # SentencePiece's space
            return None
        pos, boundary = 0, lead + len(anchor)
        for i, piece in enumerate(pieces):
            if pos == boundary:
                starts = [0]
                for p in pieces[i:-1]:
                    starts.append(starts[-1] + len(p))
                return list(ids[i:]), starts
            if pos > boundary:
                return None
            pos += len(piece)
        return ([], []) if pos == boundary else None

    def _extendable(self, tail: bytes, last: bool) -> bool:
        """Whether a vocabulary token begins with ``tail`` and goes on (``last``) or at all (an
        earlier token: one token spelling the whole tail would merge across its boundary)."""
        lo, hi = self._sorted.prefixed(tail)
        exact = lo < hi and self._sorted.keys[lo] == tail
        return hi - lo > (1 if exact and last else 0)

    @staticmethod
    def _continuations(after: tuple[bytes, ...] | None) -> list[bytes]:
        if after is None:
            return list(PROBES)
        first: dict[int, bytes] = {}
        for piece in after:
            if piece and len(piece) > len(first.get(piece[0], b"")):
                first[piece[0]] = piece
        return list(first.values())[:MAX_CONTINUATIONS]

    @staticmethod
    def _checked(walk: Walk, tokens: list[int]) -> list[int]:
        """The longest prefix of ``tokens`` the row's masks allow, position by position."""
        for i, token in enumerate(tokens):
            words = walk.mask()
            if (words is not None and not token_allowed(words, token)) or not walk.accept(token):
                return tokens[:i]
        return tokens


def _template_gap(
    allowed: Sequence[int], pieces: Sequence[bytes], before: int
) -> tuple[list[int], list[bytes]] | None:
    """Where a branch allows only whitespace and then one forced run: the tokens (and their
    bytes) that agree with the whitespace the template writes there followed by that run; else
    ``None``. Whitespace already written before the branch is not added to."""
    ahead = [p.lstrip(GAP_BYTES) for p in pieces]
    run = _common_prefix([a for a in ahead if a]) if any(ahead) else b""
    if not run or not any(p and p[0] in GAP_BYTES for p in pieces):
        return None
    gap = b"" if before < 0 or before in GAP_BYTES else template_gaps().get(gap_key(before, run[0]), b"")
    text = gap + run
    kept = [(t, p) for t, p in zip(allowed, pieces, strict=True) if p and p[: len(text)] == text[: len(p)]]
    if not kept:
        return None
    return [t for t, _ in kept], [p for _, p in kept]


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def merged(forced: list[int], proposed: list[int], limit: int) -> list[int]:
    """The row's drafts: the proposer's where they begin with the forced run (they say more),
    else the forced run; never more than ``limit``."""
    if not forced or proposed[: len(forced)] == forced:
        return proposed[:limit]
    return forced[:limit]


@runtime_checkable
class Drafting(Protocol):
    """A row's grammar that offers its forced run as drafts (a hosted row,
    :class:`~hermes_vllm.processor.hosted.HostedGrammar`): read by what it does, so this module,
    which the hosted row imports, imports nothing of it."""

    def forced_drafts(self, limit: int) -> list[int]: ...


_PATCHED = "__hermes_vllm_grammar_drafts__"
_SKIPPED = "hermes-vllm: %s: %s; no grammar drafts (constrained rows keep the proposer's drafts)"


def _wrap_update(method: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(method)
    def update_draft_token_ids(self: Any, draft_token_ids: Any) -> None:
        method(self, draft_token_ids)
        if not get_limits().grammar_drafts:
            return
        limit = self.num_spec_tokens
        for req_id in draft_token_ids.req_ids:
            request = self.requests.get(req_id)
            structured = None if request is None else request.structured_output_request
            if structured is None or request.is_finished() or request.is_prefill_chunk:
                continue
            grammar = structured.grammar
            if isinstance(grammar, Drafting):
                forced = grammar.forced_drafts(limit)
                request.spec_token_ids = merged(forced, list(request.spec_token_ids), limit)

    return update_draft_token_ids


def install() -> bool:
    """Wrap the scheduler's ``update_draft_token_ids`` once per process; False where it is missing.

    Only the synchronous scheduler calls it (vLLM's CPU engine; ``--no-async-scheduling`` on a
    GPU): under async scheduling the runner drafts for the next step itself and the scheduler only
    trims, so rows keep the proposer's drafts there."""
    return wrap_attribute(touchpoints.SCHEDULER_DRAFTS, _SKIPPED, _wrap_update, _PATCHED)
