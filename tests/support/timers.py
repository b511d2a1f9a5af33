"""Seconds spent in named functions during a benchmark run, by wrapping them for the run."""

from __future__ import annotations

import time
from typing import Any


class Timers:
    """A measurement, not a stand-in: each wrapped function runs unchanged, its wall time is added
    to its label's total."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        inner = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        setattr(owner, attribute, timed)

    def take(self) -> dict[str, float]:
        """The totals since the last call, and start afresh."""
        out, self.seconds = self.seconds, {}
        return out
