"""Memoisation of per-request checks, bounded in memory as well as in entries.

Agents resend the same tools with every turn, so the checks a request's tools go through (JSON
decoding, the metaschema, coverage) are cached by the request's text. A plain ``lru_cache`` would
let a client fill every entry with a schema of the maximum size (``Limits.max_schema_bytes``):
hundreds of MB of keys and parsed objects. Inputs up to :data:`MAX_CHARS` are kept in an LRU of
:data:`ENTRIES`; longer ones (an agent's 100-400 tools are 50-300 KB of JSON, and preparing them
again costs half a second) in a second LRU bounded by their total length, :data:`LARGE_CHARS`.
Inputs longer than :data:`LARGE_MAX_CHARS` are never cached.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import ParamSpec, TypeVar

ENTRIES = 256
"""Entries per cache: enough for the distinct tool sets of a few hundred concurrent agents."""
MAX_CHARS = 32 * 1024
"""Longest input of the entry-bounded LRU: each holds at most ENTRIES x MAX_CHARS of text (8 MiB)."""
LARGE_CHARS = 8 * 1024 * 1024
"""Total length of the longer inputs each cache keeps (some thirty agents' 400-tool sets)."""
LARGE_MAX_CHARS = 1024 * 1024
"""Longest input that is cached at all."""

P = ParamSpec("P")
R = TypeVar("R")

_CLEARS: list[Callable[[], None]] = []


def clear_memos() -> None:
    """Empty every memo, so that a benchmark can measure a tool set's first request again."""
    for clear in _CLEARS:
        clear()


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


def memoize_small(size: Callable[..., int]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Memoise ``fn`` by its arguments, bounded by ``size(...)`` of each call (see the module docstring)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        cached = functools.lru_cache(maxsize=ENTRIES)(fn)
        large = _SizedLru(LARGE_CHARS)
        _CLEARS.extend((cached.cache_clear, large.clear))

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            n = size(*args, **kwargs)
            if n <= MAX_CHARS:
                return cached(*args, **kwargs)  # type: ignore[arg-type]
            if n <= LARGE_MAX_CHARS:
                key = (args, tuple(sorted(kwargs.items())))
                return large.get(key, n, lambda: fn(*args, **kwargs))  # type: ignore[return-value]
            return fn(*args, **kwargs)

        return call

    return wrap
