"""A byte-bounded, thread-safe LRU of compiled grammars with compiles on a small thread pool.

Identical concurrent compiles share one future, so a burst of requests with the same tools
compiles once. Failed compiles are cached too (they are cheap to keep and expensive to redo).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")
_FAILURE_BYTES = 1024


class GrammarCache(Generic[T]):
    """LRU keyed by anything hashable; each entry's size comes from ``size_of``."""

    def __init__(self, max_bytes: int, threads: int, size_of: Callable[[T], int]) -> None:
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="hermes-vllm-compile")
        self._lock = threading.Lock()
        self._done: OrderedDict[Hashable, tuple[Future[T], int]] = OrderedDict()
        self._pending: dict[Hashable, Future[T]] = {}
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @property
    def bytes(self) -> int:
        """Bytes held by finished entries."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._done)

    def get(self, key: Hashable, compile_fn: Callable[[], T]) -> Future[T]:
        """The future for ``key``: cached, already compiling, or submitted now."""
        with self._lock:
            entry = self._done.get(key)
            if entry is not None:
                self._done.move_to_end(key)
                self.hits += 1
                return entry[0]
            pending = self._pending.get(key)
            if pending is not None:
                self.hits += 1
                return pending
            self.misses += 1
            future = self._pool.submit(compile_fn)
            self._pending[key] = future
        future.add_done_callback(lambda f: self._finish(key, f))
        return future

    def _finish(self, key: Hashable, future: Future[T]) -> None:
        error = future.exception()
        size = _FAILURE_BYTES if error is not None else self._size_of(future.result())
        with self._lock:
            self._pending.pop(key, None)
            if size > self.max_bytes:
                if self.max_bytes > 0:  # 0: caching is off
                    logger.warning("compiled grammar of %d bytes exceeds the cache limit; not cached", size)
                return
            self._done[key] = (future, size)
            self._bytes += size
            while self._bytes > self.max_bytes and self._done:
                _, (_, evicted) = self._done.popitem(last=False)
                self._bytes -= evicted

    def clear(self) -> None:
        with self._lock:
            self._done.clear()
            self._bytes = 0
