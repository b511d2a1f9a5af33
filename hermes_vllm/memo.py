"""Memoisation of per-request checks, bounded in memory as well as in entries.

Agents resend the same tools with every turn, so the checks a request's tools go through (JSON
decoding, the metaschema, coverage) are cached by the request's text. A plain ``lru_cache`` would
let a client fill every entry with a schema of the maximum size (``Limits.max_schema_bytes``):
hundreds of MB of keys and parsed objects. Inputs longer than :data:`MAX_CHARS` are therefore
never cached; they are rare, and only they pay the check again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

ENTRIES = 256
"""Entries per cache: enough for the distinct tool sets of a few hundred concurrent agents."""
MAX_CHARS = 32 * 1024
"""Longest input that is cached: each cache holds at most ENTRIES x MAX_CHARS of text (8 MiB)."""

P = ParamSpec("P")
R = TypeVar("R")


def memoize_small(size: Callable[..., int]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """An LRU of :data:`ENTRIES` around ``fn``, for the calls whose ``size(...)`` is <= :data:`MAX_CHARS`."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        cached = functools.lru_cache(maxsize=ENTRIES)(fn)

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if size(*args, **kwargs) <= MAX_CHARS:
                return cached(*args, **kwargs)  # type: ignore[arg-type]
            return fn(*args, **kwargs)

        return call

    return wrap
