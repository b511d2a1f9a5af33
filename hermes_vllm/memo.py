"""Memoisation of per-request checks, bounded in memory as well as in entries.

Agents resend the same tools with every turn, so the checks a request's tools go through (JSON
decoding, the metaschema, coverage) are cached by the request's text, or by each tool's. A plain
``lru_cache`` would let a client fill every entry with a schema of the maximum size
(``Limits.max_schema_bytes``): hundreds of MB of keys and parsed objects. An entry-counted one
fails the other way: an agent's 400 tools cycle through a 256-entry LRU of per-tool checks and
miss every time. Each memo therefore keeps the inputs it has seen up to a total length,
:data:`CHARS` (each input counted as at least :data:`MIN_CHARS`); an input longer than
:data:`MAX_CHARS` is never cached.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, ParamSpec, TypeVar

CHARS = 8 * 1024 * 1024
"""Total length of the inputs each memo keeps: some thirty agents' 400-tool sets, or tens of
thousands of single tools (the sizes of BFCL's sets: docs/architecture.md, "Measurements behind the code")."""
MIN_CHARS = 256
"""What the shortest inputs count for, so that a memo of short keys holds at most 32k entries."""
MAX_CHARS = 1024 * 1024
"""Longest input that is cached at all."""

P = ParamSpec("P")
R = TypeVar("R")


class _SizedLru:
    """A thread-safe LRU whose entries' sizes sum to at most ``budget`` (exceptions are not kept)."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._size = 0

    def get(self, key: Hashable, size: int, compute: Callable[[], object]) -> object:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry[0]
        value = compute()  # outside the lock: computing may take long, and may recurse
        with self._lock:
            if key not in self._entries:
                self._entries[key] = (value, size)
                self._size += size
                while self._size > self._budget:
                    _, (_, evicted) = self._entries.popitem(last=False)
                    self._size -= evicted
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._size = 0


class SizedMemo(Generic[P, R]):
    """``fn`` memoised by its (hashable) arguments, ``size(...)`` being the length of a call's input
    (see the module docstring for the bounds); made by :func:`memoize_small`."""

    def __init__(self, fn: Callable[P, R], size: Callable[..., int]) -> None:
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._size = size
        self._memo = _SizedLru(CHARS)
        _MADE.add(self)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        n = self._size(*args, **kwargs)
        if n > MAX_CHARS:
            return self._fn(*args, **kwargs)
        key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        return self._memo.get(key, max(n, MIN_CHARS), lambda: self._fn(*args, **kwargs))  # type: ignore[return-value]

    def cache_clear(self) -> None:
        """Empty the memo (as ``functools.lru_cache``'s), so that a benchmark can measure a tool
        set's first request again."""
        self._memo.clear()


def memoize_small(size: Callable[..., int]) -> Callable[[Callable[P, R]], SizedMemo[P, R]]:
    """Decorator: :class:`SizedMemo` of the function, ``size(...)`` being a call's input length."""
    return lambda fn: SizedMemo(fn, size)


_MADE: weakref.WeakSet[SizedMemo[..., Any]] = weakref.WeakSet()
"""Every :class:`SizedMemo` alive (held weakly: one per memoised function), for :func:`clear_memos`."""


def clear_memos() -> None:
    """Empty every :class:`SizedMemo`, so that a benchmark measures a tool set's first request
    again as a server's first request finds it (the memos' maker answers, where the benchmark
    once scanned every loaded module's globals for them)."""
    for memo in list(_MADE):
        memo.cache_clear()


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class IdentityMemo(Generic[V]):
    """Answers kept per tuple of objects, by their identity: for inputs that cannot be hashed (a
    tool's normalised schema, a dict) but are shared, since a memoised step made them (the same
    tool's text normalises to the same object). Each entry holds its objects, so no identity is
    reused while it is kept; at most ``entries`` are kept, the least recently used dropped."""

    def __init__(self, entries: int) -> None:
        self._entries = entries
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[int, ...], tuple[tuple[object, ...], V]] = OrderedDict()

    def get(self, objects: tuple[object, ...], compute: Callable[[], V]) -> V:
        key = tuple(map(id, objects))
        with self._lock:
            found = self._kept.get(key)
            if found is not None:
                self._kept.move_to_end(key)
                return found[1]
        value = compute()
        with self._lock:
            self._kept[key] = (objects, value)
            while len(self._kept) > self._entries:
                self._kept.popitem(last=False)
        return value


MISSING = object()
"""What ``TextKeyed.get(key, MISSING)`` answers for a key it does not keep: one lookup, where
``key in table`` then ``table[key]`` could meet a table another thread emptied in between."""


class TextKeyed(dict[K, V]):
    """A per-object cache of a pure function of some text: emptied whole once the texts it keeps
    reach ``chars`` in all (the hot path pays one dict lookup; an LRU's bookkeeping would cost more
    than most of the answers it keeps). Read it with ``get(key, MISSING)``: hosted rows are
    admitted on vLLM's compile thread while the scheduler's fills read the same tables."""

    def __init__(self, chars: int) -> None:
        super().__init__()
        self._budget = chars
        self._chars = 0

    def keep(self, key: K, text: str, value: V) -> V:
        """Store ``value`` under ``key`` (whose text is ``text``) and return it."""
        if self._chars + len(text) > self._budget:
            self.clear()
            self._chars = 0
        self._chars += len(text)
        self[key] = value
        return value
