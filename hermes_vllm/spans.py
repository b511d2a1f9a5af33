"""Split a model turn into the dialect's spans: free text, reasoning, hidden spans and tool calls.

The same reading the grammar enforces: a reasoning or hidden span is opaque (a call tag inside it
is just text), and a tool call ends at the closing tag that follows its complete JSON payload, so
a closing tag inside a JSON string does not end the call. Used by the formatter and the parsers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, NamedTuple

from hermes_vllm.dialect import Dialect, TagPair, get_dialect
from hermes_vllm.latin1 import as_latin1

SpanKind = Literal["text", "reasoning", "hidden", "call"]


@dataclass(frozen=True)
class Span:
    """A piece of the text: ``text[start:end]``; ``body`` excludes the tags."""

    kind: SpanKind
    start: int
    end: int
    body: str
    closed: bool = True
    """False for a span whose closing tag has not appeared (the text ended inside it)."""
    tags: TagPair | None = None


class _Depth:
    """Brackets' depth in JSON (or Python-literal) text read piece by piece, strings skipped: the
    one depth reader of a payload, for :func:`payload_end` (finished text, both quote styles) and
    :class:`CallEndScanner` (a call being written, JSON's quote only).

    A backslash in a string escapes the next character, in the next piece if it ends this one.
    """

    __slots__ = ("depth", "quote", "quotes", "skip")

    def __init__(self, quotes: str) -> None:
        self.quotes = quotes
        """The characters that open (and close) a string."""
        self.depth = 0
        self.quote = ""
        """The open string's quote, if any."""
        self.skip = 0
        """Characters of the next piece escaped by the last one."""

    def feed(self, text: str, i: int = 0) -> int | None:
        """Index in ``text`` just past the bracket that brings the depth back to 0 (the object,
        from ``text[i]`` on, is closed), or None: all of ``text`` read, the object still open."""
        depth, quote, quotes = self.depth, self.quote, self.quotes
        if quote and not self.skip and quote not in text and "\\" not in text:
            return None  # inside a string to its end: most of a call's pieces, read at C speed
        i += self.skip
        n = len(text)
        search = _SPECIAL[quotes].search
        flat = _FLAT[quotes].match
        while i < n:
            if quote:  # the next character that matters inside the string
                found = search(text, i)
                if found is None:
                    i = n
                    break
                i = found.start()
            else:  # past other text and whole strings to the next bracket or open quote, at C speed
                i = flat(text, i).end()  # type: ignore[union-attr]  # it matches the empty text
                if i >= n:
                    break
            ch = text[i]
            if quote:
                if ch == "\\":
                    i += 1
                elif ch == quote:
                    quote = ""
            elif ch in quotes:
                quote = ch  # a string going on past the text's end
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    self.depth, self.quote, self.skip = 0, "", 0
                    return i + 1
            i += 1
        self.depth, self.quote, self.skip = depth, quote, i - n
        return None


def _flat(quotes: str) -> re.Pattern[str]:
    """Text outside strings up to the next bracket or the quote of a string not closed in the text:
    other characters (a backslash outside a string included) and whole strings, escapes skipped."""
    other = f"[^{re.escape(quotes)}\\\\{{}}\\[\\]]+"
    strings = "|".join(f"{q}[^{q}\\\\]*(?:\\\\.[^{q}\\\\]*)*{q}" for q in quotes)
    return re.compile(f"(?:{other}|{strings}|\\\\)*", re.DOTALL)


_FLAT = {quotes: _flat(quotes) for quotes in ('"', "\"'")}
""":func:`_flat` by :class:`_Depth`'s quotes."""

_SPECIAL = {quotes: re.compile(f"[{re.escape(quotes)}\\\\]") for quotes in ('"', "\"'")}
"""The characters :meth:`_Depth.feed` acts on inside a string (its quote, a backslash), by its quotes."""


def payload_end(text: str, pos: int) -> int | None:
    """Index just past the balanced JSON (or Python-literal) object starting at ``text[pos]``.

    Brackets inside strings do not count; both quote styles are understood so that legacy
    Python-repr payloads scan too. ``None`` when the object is not closed.
    """
    return _Depth("\"'").feed(text, pos)


_SCAN: Callable[[str, int], tuple[object, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
"""json's own scanner (C): one JSON value from an index, and the index past it."""


def _object_end(text: str, pos: int) -> int | None:
    """:func:`payload_end` of the object at ``text[pos]``, read by json's scanner at C speed where
    it is whole JSON (a call a grammar wrote is): the scanner ends a JSON object where the bracket
    reader does, strings and escapes alike. Other text (Python literals, an object not closed, a
    string holding a control character) is left to the bracket reader."""
    try:
        return _SCAN(text, pos)[1]
    except (ValueError, StopIteration, RecursionError):
        return payload_end(text, pos)


def _call_end(text: str, body_start: int, end_tag: str, strict: bool = False) -> tuple[int, int] | None:
    """(body end, span end) of a call whose body starts at ``body_start``, or None if unclosed.

    The closing tag must follow the balanced payload; when the payload is not balanced
    (a broken call) the first closing tag after the opening ends it, unless ``strict``: then
    only a balanced payload followed by the tag closes the call, as in the grammar. Without a
    closing tag after the opening the call is open, whatever its payload: nothing is read.
    """
    if text.find(end_tag, body_start) == -1:
        return None
    j = body_start
    while j < len(text) and text[j].isspace():
        j += 1
    if j < len(text) and text[j] == "{":
        close = _object_end(text, j)
        if close is not None:
            tag_at = text.find(end_tag, close)
            if tag_at != -1 and not text[close:tag_at].strip():
                return tag_at, tag_at + len(end_tag)
            if tag_at == -1:
                return None
    if strict:
        return None
    tag_at = text.find(end_tag, body_start)
    return None if tag_at == -1 else (tag_at, tag_at + len(end_tag))


def split_spans(text: str, dialect: str | Dialect = "hermes", *, strict: bool = False) -> list[Span]:
    """Split ``text`` into consecutive spans covering it entirely, in order.

    ``strict``: a call is closed only by its balanced payload and the closing tag (what the grammar
    admits), never by a closing tag inside an unfinished payload; for text still being written.
    """
    found = reader_of(get_dialect(dialect)).bounds(text, strict)
    return [Span(kind, start, end, text[lo:hi], shut, tags) for kind, start, end, lo, hi, shut, tags in found]


_Bounds = tuple[SpanKind, int, int, int, int, bool, TagPair | None]
"""A span as :meth:`DialectReader.bounds` finds it: kind, start, end, its body's start and end,
closed, tags."""


def partial_tag_suffix(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags``.

    Streaming parsers hold back that many characters: they may yet become a tag.
    """
    best = 0
    n = len(text)
    for tag in tags:
        if len(tag) < 2:
            continue
        # Suffixes from the longest down, each starting at an occurrence of the tag's first character.
        at = text.find(tag[0], max(n - len(tag) + 1, 0), n - best)
        while at != -1:
            if tag.startswith(text[at:]):
                best = n - at
                break
            at = text.find(tag[0], at + 1, n - best)
    return best


class Tail(NamedTuple):
    """How a text ends, as far as the tool-call grammar cares: what the span gates read.

    A named tuple, not a dataclass: the follower builds one at every token that can change it,
    and a frozen dataclass's construction costs several times a tuple's."""

    open: Span | None
    """The span the text ends inside (its closing tag not yet written), if any."""
    begun: Literal["call", "span"] | None
    """A call tag, or a reasoning/hidden span's tag, partly written at the very end."""
    calls: int
    """Complete or open calls in the text."""
    end_begun: bool
    """The open span's closing tag is partly written at the very end."""

    @property
    def clean(self) -> bool:
        """Free text with no span open and no tag begun: the grammar is back where a turn starts."""
        return self.open is None and self.begun is None


SHORT_TAIL = 32
"""Texts up to this long have their tail kept (:meth:`DialectReader.read_tail`)."""

SHORT_TAILS_MAX = 4096
"""The most short texts' tails a dialect's reader keeps at once, and the most tails of texts no
span is open at the end of (each table is emptied when it is full)."""

READERS_MAX = 16
"""The most dialects' readers kept at once (:func:`reader_of`): a process reads a few dialects."""


class DialectReader:
    """One dialect's reader of tags: its opening tags, and the tails it has read, kept.

    Everything here follows from the dialect alone, so one reader serves every text and every row
    of it (:func:`reader_of`); a row's follower holds its dialect's and reads through it at every
    tag token. The kept tails are immutable, so one read serves every row; both tables are
    bounded (:data:`SHORT_TAILS_MAX`).
    """

    __slots__ = ("_free", "_short", "call_first", "dialect", "longest", "marks", "openers")

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        openers: list[tuple[str, SpanKind, TagPair]] = [(dialect.tool_call.begin, "call", dialect.tool_call)]
        openers += [(p.begin, "reasoning", p) for p in dialect.reasoning]
        openers += [(p.begin, "hidden", p) for p in dialect.hidden]
        self.openers = openers
        """The tags that open a span in the dialect's text, with the span's kind."""
        self.longest = max(len(b) for b, _, _ in openers)
        """The longest opening tag's length: only the text's last characters, one fewer, can begin a tag."""
        self.marks = frozenset(p.begin[0] for p in (dialect.tool_call, *dialect.free_spans))
        """The tags' first characters: at a clean point only a piece holding one is read (a set's
        ``isdisjoint`` reads a piece at C speed: a follower asks it of every free-text token)."""
        begin = dialect.tool_call.begin
        self.call_first = not any(len(b) > len(begin) and b.startswith(begin) for b, _, _ in openers)
        """Whether a text beginning with a call's opening tag has the call as its first span (no
        longer opening tag begins with it): the end of such a call is read alone (:meth:`call_tail`)."""
        self._short: dict[str, Tail] = {}
        """Short texts' tails by the text (:meth:`read_tail`)."""
        self._free: dict[tuple[str, int], Tail] = {}
        """The tails of texts no span is open at the end of, by the text's last characters (those a
        tag may begin in) and the count of calls (:meth:`tail`): a row's follower reads one after
        every call it closes."""

    def bounds(self, text: str, strict: bool) -> list[_Bounds]:
        """:func:`split_spans`'s spans as tuples, no body copied: :meth:`read` builds a
        :class:`Span` only for the span the text ends inside."""
        openers = self.openers
        spans: list[_Bounds] = []
        pos = 0
        text_start = 0
        n = len(text)
        while pos < n:
            # The first opening tag, the longest where two begin at the same place.
            best: tuple[int, int, SpanKind, TagPair] | None = None
            for begin, kind, pair in openers:
                at = text.find(begin, pos)
                if at != -1 and (best is None or (at, -len(begin)) < (best[0], best[1])):
                    best = (at, -len(begin), kind, pair)
            if best is None:
                break
            at, _, kind, pair = best
            if at > text_start:
                spans.append(("text", text_start, at, text_start, at, True, None))
            body_start = at + len(pair.begin)
            if kind == "call":
                bounds = _call_end(text, body_start, pair.end, strict)
            else:
                tag_at = text.find(pair.end, body_start)
                bounds = None if tag_at == -1 else (tag_at, tag_at + len(pair.end))
            if bounds is None:
                spans.append((kind, at, n, body_start, n, False, pair))
                return spans
            spans.append((kind, at, bounds[1], body_start, bounds[0], True, pair))
            pos = text_start = bounds[1]
        if text_start < n:
            spans.append(("text", text_start, n, text_start, n, True, None))
        return spans

    def read_tail(self, text: str) -> Tail:
        """Where ``text`` (a turn, or its part since a clean point) stands; see :class:`Tail`.

        A short text's tail is kept: a row's follower reads a few short texts again and again,
        one per call at least (the opening tag alone, as the text since a clean point; the stop
        token's text after a call), each a read of every tag of the dialect."""
        if len(text) > SHORT_TAIL:
            return self.read(text)
        known = self._short.get(text)
        if known is not None:
            return known
        tail = self.read(text)
        if len(self._short) >= SHORT_TAILS_MAX:
            self._short.clear()
        self._short[text] = tail
        return tail

    def read(self, text: str) -> Tail:
        """:meth:`read_tail`, read: every span of ``text`` looked for."""
        spans = self.bounds(text, True)
        return self.tail(text, spans[-1] if spans else None, sum(s[0] == "call" for s in spans))

    def tail(self, text: str, last: _Bounds | None, calls: int) -> Tail:
        """The tail of ``text`` whose last span is ``last`` and which holds ``calls`` calls."""
        if last is not None and not last[5]:
            kind, start, end, body_start, _, _, pair = last
            assert pair is not None
            span = Span(kind, start, end, text[body_start:], closed=False, tags=pair)
            return Tail(span, None, calls, bool(partial_tag_suffix(text, (pair.end,))))
        # Only the last characters can begin a tag: one fewer than the longest opening tag has.
        ending = text[max(0, len(text) - self.longest + 1) :]
        key = (ending, calls)
        known = self._free.get(key)
        if known is not None:
            return known
        dialect = self.dialect
        if partial_tag_suffix(ending, (dialect.tool_call.begin,)):
            tail = Tail(None, "call", calls, False)
        elif partial_tag_suffix(ending, tuple(p.begin for p in dialect.free_spans)):
            tail = Tail(None, "span", calls, False)
        else:
            tail = Tail(None, None, calls, False)
        if len(self._free) >= SHORT_TAILS_MAX:
            self._free.clear()
        self._free[key] = tail
        return tail

    def call_tail(self, text: str, pair: TagPair) -> Tail:
        """:meth:`read_tail` of ``text`` that begins with a call's opening tag (``pair``'s), where
        :attr:`call_first`: the call is the text's first span, so only its end is looked for (a
        text going on after the call is read whole)."""
        n = len(text)
        body_start = len(pair.begin)
        bounds = _call_end(text, body_start, pair.end, True)
        if bounds is None:
            return self.tail(text, ("call", 0, n, body_start, n, False, pair), 1)
        if bounds[1] < n:
            return self.read(text)
        return self.tail(text, ("call", 0, n, body_start, bounds[0], True, pair), 1)


@lru_cache(maxsize=READERS_MAX)
def reader_of(dialect: Dialect) -> DialectReader:
    """``dialect``'s one reader (equal dialects share it), kept for the next look-up."""
    return DialectReader(dialect)


def read_tail(text: str, dialect: Dialect) -> Tail:
    """Where ``text`` (a turn, or its part since a clean point) stands, read by ``dialect``'s
    reader (:meth:`DialectReader.read_tail`); see :class:`Tail`."""
    return reader_of(dialect).read_tail(text)


class TextFollower:
    """A row's text (latin-1, one char a byte) since its last clean point and where it stands:
    the one follower of a generated turn that the processor's gate and the turn's budget read.

    Only a token that can change the tail is read again: inside a span one holding its closing
    tag's first byte, at a clean point one holding a tag's first byte (the rest is appended, or
    at a clean point dropped).
    """

    __slots__ = ("_call_first", "_marks", "_reader", "calls", "dialect", "reach", "recent", "tail", "text")

    def __init__(self, dialect: Dialect, reach: int = 0) -> None:
        self.dialect = dialect
        reader = self._reader = reader_of(dialect)
        """The dialect's reader: :meth:`feed` reads the tail through it, no look-up a token."""
        self.text = ""
        """Text since the last clean point."""
        self.tail: Tail = reader.read_tail("")
        self.calls = 0
        """Calls begun before the last clean point."""
        self.reach = reach
        self.recent = ""
        """The last ``reach`` characters written, clean points or not: where a stop string may
        have begun."""
        self._marks = reader.marks
        """:attr:`DialectReader.marks`, held here: the follower asks it of every free-text token."""
        self._call_first = reader.call_first
        """:attr:`DialectReader.call_first`: the end of a call the text begins with is read alone."""

    @property
    def calls_begun(self) -> int:
        return self.calls + self.tail.calls + (self.tail.begun == "call")

    def feed(self, piece: str) -> bool:
        """Follow one token (its bytes as latin-1); whether the tail was read again."""
        if self.reach:
            self.recent = (self.recent + piece)[-self.reach :]
        tail = self.tail
        span = tail.open
        if span is not None and not tail.end_begun:
            assert span.tags is not None
            if span.tags.end[0] not in piece:  # only the closing tag changes where a span stands
                self.text += piece
                return False
        elif tail.clean and self._marks.isdisjoint(piece):
            return False
        self.text += piece
        if span is not None and span.start == 0 and span.kind == "call" and self._call_first:
            assert span.tags is not None
            new = self._reader.call_tail(self.text, span.tags)
        else:
            new = self._reader.read_tail(self.text)
        if new.clean:
            self.calls += new.calls
            self.text = ""
        self.tail = new
        return True

    def steady(self, pieces: Sequence[str], start: int) -> int:
        """The end of the run of ``pieces`` from ``start`` that :meth:`feed` would each follow
        without reading the tail again (inside a span, none holds its closing tag's first
        character; at a clean point, none a tag's): such a run is followed at once (:meth:`take`)."""
        tail = self.tail
        span = tail.open
        end = len(pieces)
        j = start
        if span is not None and not tail.end_begun:
            assert span.tags is not None
            first = span.tags.end[0]
            while j < end and first not in pieces[j]:
                j += 1
        elif tail.clean:
            marks = self._marks
            while j < end and marks.isdisjoint(pieces[j]):
                j += 1
        return j

    def take(self, run: str) -> None:
        """Follow a steady run's text (:meth:`steady`): what :meth:`feed` does with each of its
        pieces, at once."""
        if self.reach:
            self.recent = (self.recent + run)[-self.reach :]
        if self.tail.open is not None:
            self.text += run


class CallTagScanner:
    """Where a call tag completes in free text written piece by piece, for a matcher that hands
    the call's bytes to another automaton from there (the composed matcher at agent scale).

    Reads latin-1 text (one char a byte, so offsets are the bytes'), its tags spelled the same way.
    Free text holds no tag's begin, and a span's text no end of it (as the turn grammar says), so
    the first tag written is the one that counts; what may yet become a tag is held back
    (:func:`partial_tag_suffix`).
    """

    def __init__(self, dialect: Dialect) -> None:
        self.begin = as_latin1(dialect.tool_call.begin)
        self.spans = [(as_latin1(p.begin), as_latin1(p.end)) for p in dialect.free_spans]
        self.span: int | None = None
        """The reasoning / hidden span the text is inside (its index), if any."""
        self.carry = ""

    def feed(self, piece: str) -> int | None:
        """Offset in ``piece`` just after a completed call tag (the rest is the call's), or None."""
        buf, base, i = self.carry + piece, len(self.carry), 0
        while True:
            if self.span is None:
                tags = [(self.begin, -1), *((b, j) for j, (b, _) in enumerate(self.spans))]
            else:
                tags = [(self.spans[self.span][1], -2)]
            found = [(pos, tag, kind) for tag, kind in tags if (pos := buf.find(tag, i)) >= 0]
            if not found:
                rest = buf[i:]
                self.carry = rest[len(rest) - partial_tag_suffix(rest, tuple(tag for tag, _ in tags)) :]
                return None
            pos, tag, kind = min(found)
            i = pos + len(tag)
            if kind == -1:
                self.carry = ""
                return i - base
            self.span = None if kind == -2 else kind

    def partial_call(self) -> str:
        """The call tag's characters still to come where the text ends inside one (else empty)."""
        if self.span is not None:
            return ""
        written = partial_tag_suffix(self.carry, (self.begin,))
        return self.begin[written:] if written else ""


class CallEndScanner:
    """Where a call ends in its text written piece by piece, read from its arguments' colon on, for
    a matcher that handed the call's bytes to another automaton and takes the text back after it
    (the composed matcher at agent scale, whose tool grammar holds the call's end).

    Reads latin-1 text (one char a byte, so offsets are the bytes'), the closing tag spelled the
    same way. The text is what the tool grammar admits: the arguments' JSON value, the call
    object's ``}``, the closing tag. So the arguments close where the depth comes back to 0 outside
    strings (:func:`payload_end`'s reader, JSON's quote only) and the call at the first closing tag
    after that, as :func:`split_spans` reads a finished call: a closing tag inside a string, or a
    tag split across pieces, is read where the grammar reads it.
    """

    __slots__ = ("depth", "end", "tail")

    def __init__(self, dialect: Dialect) -> None:
        self.end = as_latin1(dialect.tool_call.end)
        self.depth = _Depth('"')
        self.tail: str | None = None
        """The text since the arguments closed (None while they are open)."""

    def feed(self, piece: str) -> int | None:
        """Offset in ``piece`` just after the call's closing tag (the rest is free text), or None."""
        i = 0
        if self.tail is None:
            closed = self.depth.feed(piece)
            if closed is None:
                return None
            i, self.tail = closed, ""
        before = len(self.tail)
        self.tail += piece[i:]
        at = self.tail.find(self.end)
        return None if at < 0 else i + at + len(self.end) - before


def open_at_end(prompt: str, dialect: Dialect) -> Span | None:
    """The reasoning or hidden span ``prompt`` leaves open, whose body the model writes next.

    Qwen3-Thinking-2507, Qwen 3.5 and DeepSeek-R1 templates end their generation prompt with
    ``<think>\n``: the output then starts inside the span and may hold only its closing tag.
    Only the last turn is read (after the dialect's turn marker, where there is one); the span's
    ``start`` is its offset in ``prompt``. A prompt ending inside a call opens nothing: a call is
    the model's to write, whatever a prompt spells.
    """
    marker = prompt.rfind(dialect.turn.begin)
    base = 0 if marker < 0 else marker + len(dialect.turn.begin)
    span = read_tail(prompt[base:], dialect).open
    if span is None or span.kind == "call":
        return None
    return Span(span.kind, base + span.start, base + span.end, span.body, closed=False, tags=span.tags)


def unopened_reasoning(text: str, dialect: Dialect) -> TagPair | None:
    """The reasoning span ``text`` starts inside when it holds that span's closing tag before any
    opening tag: a prompt nobody showed the reader opened it.

    What vLLM's qwen3 and deepseek_r1 parsers read, built with no prompt: ``reasoning</think>
    answer`` is reasoning ``reasoning``. ``None`` while no such closing tag is in ``text`` (or an
    opening tag comes first): the text then stands where it was written.
    """
    openers = [p.begin for p in (dialect.tool_call, *dialect.free_spans)]
    first = min((at for tag in openers if (at := text.find(tag)) != -1), default=len(text))
    for tags in dialect.reasoning:
        at = text.find(tags.end)
        if at != -1 and at < first:
            return tags
    return None
