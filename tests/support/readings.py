"""What the tests and benchmarks read from a running server: each reply in one shape, and what the
server's processes used."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psutil


@dataclass(frozen=True)
class Reply:
    """One chat completion as the server tests read it; a stream folded into the same shape."""

    finish_reason: str | None
    calls: list[tuple[str, str]]
    """(name, arguments) of each returned tool call."""
    content: str
    reasoning: str
    token_ids: list[int] = field(default_factory=list)
    raw: str = ""
    """The generated text itself, decoded from the returned token ids, where a test needs it."""
    error: str = ""
    """What went wrong, for a request that failed (an HTTP error is a failed reply)."""
    reasoning_tokens: int | None = None
    """``usage``'s reasoning tokens, where the reply reported usage."""


@dataclass(frozen=True)
class Usage:
    """What a server's processes have used so far, summed over the server and its engine core."""

    cpu_seconds: float
    """User plus system time: unlike wall time, not stretched by other tenants of the machine."""
    rss_bytes: int


def server_usage(base_url: str) -> Usage:
    """CPU time and resident memory of the server listening on ``base_url`` and its children.

    The OpenAI server runs its engine core in a child process even with
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the server's own ``/metrics`` miss most of the work.
    """
    port = urlsplit(base_url).port
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            root = psutil.Process(conn.pid)
            tree = [root, *root.children(recursive=True)]
            times = [p.cpu_times() for p in tree]
            return Usage(sum(t.user + t.system for t in times), sum(p.memory_info().rss for p in tree))
    raise LookupError(f"no process listens on port {port}")
