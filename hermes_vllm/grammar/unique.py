"""The processor's half of ``uniqueItems``: no item equal to an earlier one is closed.

The arrays kept here are those :mod:`hermes_vllm.schema.unique` names (distinct plain strings,
integers or numbers: pydantic's ``set[str]``, ``set[int]``, ``frozenset[float]``); the engines
compile them without the keyword. A :class:`UniqueGuard` rides on a request's matcher: it follows
the text, reads the call it is inside (which tool, which array, which items were closed), and
clears from each mask the tokens that would close an item equal to an earlier one, the item being
read as a value (``"a"`` and ``"\\u0061"`` are one string, ``1`` and ``1.0`` one number). Such an
item can always be written on instead (a string to another character, a number to another
digit); the one item that cannot, an integer ``0``, is refused as it is written where ``0`` was.

Where the array is read through several readings (an ``anyOf``, a call whose name comes after its
arguments), the guard keeps it distinct when any reading asks for it: a distinct array is valid
for the others too. Should no token but a repeating one be left (the grammar says the reading
that wants distinct items is over), nothing is refused.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hermes_vllm.dialect import Dialect
from hermes_vllm.grammar.engines.base import EngineMatcher, allocate_bitmask
from hermes_vllm.latin1 import as_text
from hermes_vllm.schema.spec import JSON
from hermes_vllm.schema.tree import resolve_ref
from hermes_vllm.schema.unique import item_value, keeps_unique, kept_kind
from hermes_vllm.spans import TextFollower
from hermes_vllm.vocabulary import Vocabulary

logger = logging.getLogger(__name__)

_WS = " \t\n\r"
_NUMBER = frozenset("0123456789+-.eE")
_MAX_REFS = 32
"""``$ref`` hops followed when reading where a value sits (recursive schemas)."""


Candidates = tuple[tuple[JSON, JSON], ...]
"""The schemas a value may be read under, each with the ``$ref`` root it resolves in."""


def _expand(schema: JSON, root: JSON, depth: int = 0) -> Iterator[tuple[JSON, JSON]]:
    """``schema`` and, through ``$ref`` and combinators, every schema it may be read under."""
    if depth > _MAX_REFS or not isinstance(schema, dict):
        return
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        with suppress(LookupError):
            yield from _expand(resolve_ref(root, ref), root, depth + 1)
    yield schema, root
    for key in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(key, ()):
            yield from _expand(branch, root, depth + 1)


def _children(candidates: Candidates, key: str | None, index: int) -> Candidates:
    """The schemas of an object's member ``key`` (or an array's item ``index``)."""
    out: list[tuple[JSON, JSON]] = []
    for schema, root in candidates:
        if key is not None:
            props = schema.get("properties", {})
            sub = props.get(key) if isinstance(props, dict) else None
            if sub is None:
                sub = schema.get("additionalProperties")
        else:
            prefix = schema.get("prefixItems", [])
            sub = prefix[index] if isinstance(prefix, list) and index < len(prefix) else schema.get("items")
        out += _expand(sub, root) if isinstance(sub, dict) else ()
    return tuple(out)


def item_key(kind: str, raw: str) -> Any:
    """An item's value as the client compares it; ``raw`` is its JSON text (bytes as latin-1,
    a string's without its quotes)."""
    if kind != "string":
        return item_value(raw)
    if raw.isascii() and "\\" not in raw:  # most items: the text is the value
        return raw
    return item_value(as_text('"' + raw + '"'))


@dataclass
class _Frame:
    """One open object or array of the call."""

    array: bool
    candidates: Candidates
    envelope: bool = False
    """The call's own ``{"name": ..., "arguments": ...}``."""
    key: str | None = None
    """The member being written (objects), once its key is closed."""
    index: int = 0
    kinds: frozenset[str] = frozenset()
    """Item types kept distinct here (arrays)."""
    seen: set[Any] = field(default_factory=set)
    """The closed items' values (arrays whose items are kept distinct)."""


class _Call:
    """Where a call's text stands: its open containers, the value being written, the tool."""

    def __init__(self, tools: dict[str, JSON]) -> None:
        self.tools = tools
        self.name: str | None = None
        self.stack: list[_Frame] = []
        self.scalar: str | None = None
        """``"string"``, ``"key"``, ``"number"``, ``"word"`` (true/false/null) or ``None``."""
        self.raw = ""
        self.escape = False
        self.done = False

    def feed(self, text: str) -> None:
        for c in text:
            if self.done:
                return
            self._char(c)

    def _char(self, c: str) -> None:
        scalar = self.scalar
        if scalar in ("string", "key"):
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.scalar = None
                self._closed(scalar, self.raw)
                return
            self.raw += c
            return
        if scalar == "number":
            if c in _NUMBER:
                self.raw += c
                return
            self.scalar = None
            self._closed("number", self.raw)
        elif scalar == "word":
            if c.isalpha():
                return
            self.scalar = None
            self._closed("word", "")
        top = self.stack[-1] if self.stack else None
        if c in _WS or c == ":":
            return
        if c == ",":
            if top is not None and top.array:
                top.index += 1
            elif top is not None:
                top.key = None
            return
        if c in "}]":
            if self.stack:  # the grammar closes only what is open; the guard never raises
                self.stack.pop()
            self._closed("container", "")
            return
        if c == '"':
            self.scalar = "key" if top is not None and not top.array and top.key is None else "string"
            self.raw = ""
            return
        if c in "{[":
            self._open(c == "[")
            return
        self.scalar = "number" if c == "-" or c.isdigit() else "word"
        self.raw = c

    def _value_candidates(self) -> tuple[Candidates, bool]:
        """The schemas of the value starting now, and whether it is the envelope."""
        if not self.stack:
            return (), True
        top = self.stack[-1]
        if top.envelope:
            if top.key != "arguments":
                return (), False
            tools = [self.tools[self.name]] if self.name in self.tools else list(self.tools.values())
            return tuple(c for t in tools for c in _expand(t, t)), False
        return _children(top.candidates, None if top.array else top.key, top.index), False

    def _open(self, array: bool) -> None:
        candidates, envelope = self._value_candidates()
        kinds = frozenset(k for s, _ in candidates if (k := kept_kind(s))) if array else frozenset()
        self.stack.append(_Frame(array, candidates, envelope=envelope, kinds=kinds))

    def _closed(self, kind: str, raw: str) -> None:
        """A value (or key) closed: where it belongs."""
        if not self.stack:
            self.done = True
            return
        top = self.stack[-1]
        if kind == "key":
            top.key = item_key("string", raw)
            return
        if top.envelope and top.key == "name" and kind == "string":
            self.name = item_key("string", raw)
        if top.array and top.kinds and kind in ("string", "number"):
            top.seen.add(item_key(kind, raw))

    def repeats(self, piece: str) -> bool:
        """Whether writing ``piece`` now would close an item equal to an earlier one (or leave an
        integer ``0`` that can only close so), in the innermost array if its items are kept
        distinct. Reads the piece without moving."""
        top = self.stack[-1] if self.stack else None
        if top is None or not top.array or not top.kinds or self.scalar in ("key", "word"):
            return False
        kinds, seen = top.kinds, top.seen
        extra: list[Any] = []
        scalar, raw, escape = self.scalar, self.raw, self.escape
        for c in piece:
            if scalar == "string":
                if escape:
                    escape = False
                elif c == "\\":
                    escape = True
                elif c == '"':
                    value = item_key("string", raw)
                    if value in seen or value in extra:
                        return True
                    extra.append(value)
                    scalar = None
                    continue
                raw += c
                continue
            if scalar == "number":
                if c in _NUMBER:
                    raw += c
                    continue
                value = item_key("number", raw)
                if value in seen or value in extra:
                    return True
                extra.append(value)
                scalar = None
            if c in _WS or c == ",":
                continue
            if c == '"' and "string" in kinds:
                scalar, raw = "string", ""
            elif (c == "-" or c.isdigit()) and kinds & {"integer", "number"}:
                scalar, raw = "number", c
            else:
                return False  # the array ends, or an item not kept distinct begins
        stuck = scalar == "number" and raw in ("0", "-0") and "number" not in kinds
        return stuck and (0 in seen or 0 in extra)

    def plain_closings(self, plain: dict[str, np.ndarray]) -> np.ndarray | None:
        """Inside a string item: of the tokens closing it plainly (by the text before their
        quote, :class:`_Pieces`), those that would close a repeat; ``None`` where the item is not
        read so simply (an escape, other bytes, items of other kinds)."""
        top = self.stack[-1]
        raw = self.raw
        if self.escape or top.kinds != {"string"} or not raw.isascii() or "\\" in raw:
            return None
        found = [
            plain[v[len(raw) :]]
            for v in top.seen
            if isinstance(v, str) and v.startswith(raw) and v.isascii() and v[len(raw) :] in plain
        ]
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    @property
    def active(self) -> bool:
        top = self.stack[-1] if self.stack else None
        return top is not None and top.array and bool(top.kinds) and self.scalar not in ("key", "word")


@dataclass(frozen=True)
class _Pieces:
    """Per vocabulary, the tokens that can close an item. Inside a string: those holding a quote,
    most of them plainly (one quote, ASCII and no backslash before it: by the text before the
    quote), the rest to be read; between items: those holding two quotes or a digit (by id)."""

    plain: dict[str, np.ndarray]
    other_quotes: np.ndarray
    between: np.ndarray


def _pieces(vocab: Vocabulary) -> _Pieces:
    """The vocabulary's :class:`_Pieces`, built once (a table it keeps)."""
    return vocab.table("unique items' closing pieces", lambda: _read_pieces(vocab.latin1))


def _read_pieces(latin1: list[str]) -> _Pieces:
    plain: dict[str, list[int]] = {}
    other: list[int] = []
    for i, piece in enumerate(latin1):
        k = piece.find('"')
        if k < 0:
            continue
        if piece.count('"') == 1 and piece[:k].isascii() and "\\" not in piece[:k]:
            plain.setdefault(piece[:k], []).append(i)
        else:
            other.append(i)
    between = np.array(
        [piece.count('"') > 1 or any(c.isdigit() for c in piece) for piece in latin1], dtype=bool
    )
    return _Pieces(
        {k: np.array(v, dtype=np.int64) for k, v in plain.items()}, np.array(other, dtype=np.int64), between
    )


def _held(view: np.ndarray, ids: np.ndarray, size: int) -> np.ndarray:
    """The ``ids`` a packed mask row (as uint32 words) allows."""
    ids = ids[ids < size]
    held: np.ndarray = ids[(view[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1 == 1]
    return held


def _allowed(words: np.ndarray, size: int) -> np.ndarray:
    """The ids a packed mask row allows (read from its nonzero words only)."""
    view = words.view(np.uint32)
    nonzero = np.flatnonzero(view)
    bits = np.unpackbits(view[nonzero].view(np.uint8), bitorder="little").reshape(-1, 32).astype(bool)
    ids: np.ndarray = (nonzero[:, None] * 32 + np.arange(32))[bits]
    kept: np.ndarray = ids[ids < size]
    return kept


class UniqueGuard:
    """Follows one request's text and keeps the items of its kept arrays distinct."""

    def __init__(self, dialect: Dialect, tools: Sequence[tuple[str, JSON]], vocab: Vocabulary) -> None:
        self._dialect = dialect
        self._tools = dict(tools)
        self._vocab = vocab
        self._latin1 = vocab.latin1
        self._history: list[int] = []
        self._follower = TextFollower(dialect)
        self._call: _Call | None = None
        self._body = ""
        self.refused = 0
        """Tokens cleared from masks so far (for tests and logs)."""

    @staticmethod
    def warm(vocab: Vocabulary) -> None:
        """Read the vocabulary's quoted and numeric pieces now (start-up), not on the first
        request whose tools keep ``uniqueItems``."""
        _pieces(vocab)

    @classmethod
    def for_turn(
        cls, dialect: Dialect, tools: Sequence[tuple[str, JSON]], vocab: Vocabulary
    ) -> UniqueGuard | None:
        """A guard where some tool keeps ``uniqueItems`` by the processor; ``None`` elsewhere."""
        return cls(dialect, tools, vocab) if any(keeps_unique(p) for _, p in tools) else None

    def feed(self, token_id: int) -> None:
        self._history.append(token_id)
        self._follow(token_id)

    def _follow(self, token_id: int) -> None:
        piece = self._latin1[token_id] if 0 <= token_id < len(self._latin1) else ""
        follower = self._follower
        follower.feed(piece)
        tail = follower.tail
        if tail.open is None or tail.open.kind != "call" or tail.end_begun:
            self._call, self._body = None, ""
            return
        body = follower.text[tail.open.start + len(self._dialect.tool_call.begin) :]
        if self._call is None or not body.startswith(self._body):
            self._call, self._body = _Call(self._tools), ""
        self._call.feed(body[len(self._body) :])
        self._body = body

    def rollback(self, num_tokens: int) -> None:
        """Replay the history without the last ``num_tokens`` (rollbacks are rare)."""
        history = self._history[: len(self._history) - num_tokens] if num_tokens > 0 else self._history
        self._history, self._follower, self._call, self._body = [], TextFollower(self._dialect), None, ""
        for token_id in history:
            self.feed(token_id)

    @property
    def active(self) -> bool:
        """Inside an array whose items are kept distinct: masks are read token by token."""
        return self._call is not None and self._call.active

    def ban(self, words: np.ndarray) -> int:
        """Clear from a packed mask row (int32 words) the tokens that would close a repeated item;
        the number cleared. Where only such tokens were allowed, none is cleared."""
        call = self._call
        if call is None or not call.active:
            return 0
        size = min(len(self._latin1), words.size * 32)
        pieces = _pieces(self._vocab)
        view = words.view(np.uint32)
        banned: list[int] = []
        if call.scalar == "string":  # most of the vocabulary goes on: only a quote closes
            plain = call.plain_closings(pieces.plain)
            if plain is not None:  # a plain closing repeats when the text before its quote does
                banned += _held(view, plain, size).tolist()
                read = pieces.other_quotes
            else:
                read = np.concatenate([pieces.other_quotes, *pieces.plain.values()])
            allowed = _held(view, read, size)
        else:  # few tokens go on a number or begin an item
            allowed = _allowed(words, size)
            if call.scalar is None:
                allowed = allowed[pieces.between[allowed]]
        banned += [int(t) for t in allowed if call.repeats(self._latin1[t])]
        if not banned:
            return 0
        before = view.copy()
        for token in banned:
            view[token >> 5] &= np.uint32(0xFFFFFFFF ^ (1 << (token & 31)))
        if not view.any():
            view[:] = before
            logger.info("hermes-vllm: only repeated items are left here; the array is read otherwise")
            return 0
        self.refused += len(banned)
        return len(banned)

    def allows(self, token_id: int, matcher: EngineMatcher) -> bool:
        """Whether the token may be accepted: it closes no repeated item, or the grammar (read
        from ``matcher``, before the token) leaves nothing else."""
        call = self._call
        if call is None or not call.active:
            return True
        piece = self._latin1[token_id] if 0 <= token_id < len(self._latin1) else ""
        if not call.repeats(piece):
            return True
        row = allocate_bitmask(1, len(self._latin1))
        if not matcher.fill_bitmask(row, 0):
            row.fill_(-1)
        words = row[0].numpy()
        return self.ban(words) == 0
