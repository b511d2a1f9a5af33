"""hermes-vllm's own Prometheus series: what the constraint did, on the server's ``/metrics``.

Every series is defined here (name, type, labels and their fixed values, help), and recorded in
whichever process the event happens in: admission and replies in the API server (one or
several), compiles, budgets and steps in the engine core or its workers. Those are different
processes, and vLLM serves ``/metrics`` from the API server's registry alone (its own engine
figures travel to the API server inside each step's scheduler stats, which have no room for
ours). So each process writes its values into memory-mapped files in prometheus_client's
multiprocess format, one file per process and kind (``counter_hermes-<pid>.db``, ...), in one
directory shared by the whole server:

- with several API servers (``--api-server-count 2``) vLLM runs Prometheus multiprocess mode and
  sets ``PROMETHEUS_MULTIPROC_DIR`` before it starts any process; our files go there, and vLLM's
  own multiprocess collector serves them with its series from every API server;
- otherwise the general plugin exports a directory of ours (:data:`ENV`) before vLLM starts its
  engine processes, and :func:`install` registers a collector reading it in the process's
  default registry, which a single API server serves and offline ``LLM.get_metrics()`` reads.

A write is a few bytes into a mapped page (no system call, no lock contention): counters move
once per request event, the step's histogram and gauge once per engine step, never per token.
Without a directory (the library used without vLLM's plugin) recording does nothing.
"""

from __future__ import annotations

import atexit
import bisect
import contextlib
import glob
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import REGISTRY, mmap_dict, multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import mmap_key
from prometheus_client.utils import floatToGoString

events = logging.getLogger("vllm").getChild("hermes_vllm")
"""The operator's log: one line per refused request (INFO), per left-out tool and per budget action
(DEBUG), never one per token. A child of the logger vLLM configures (its handler, format and
``VLLM_LOGGING_LEVEL`` apply; where vLLM configured nothing it propagates to the root as any
logger): a server's API process logs other libraries' lines at ERROR only. A logging name, not a
vLLM interface."""

ENV = "HERMES_VLLM_METRICS_DIR"
"""The directory of one server's (or offline engine's) files, exported by the general plugin."""
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Set by vLLM (or the operator) for Prometheus multiprocess mode: then our files go there."""
PREFIX = "hermes_vllm:"

Kind = Literal["counter", "histogram", "gauge"]

TOOL_CHOICES = ("auto", "required", "named", "none")
OUTCOMES = ("complete", "budget_closed", "cut")
ACTIONS = ("reasoning_closed", "call_opened", "answer_opened")
REASONS = (
    "unsatisfiable_schema",
    "unsupported_keyword",
    "invalid_schema",
    "budget_too_small",
    "no_shortest_value",
    "combination",
    "inactive",
    "invalid_request",
)
"""Why a request was refused with HTTP 400 (``refused_requests_total``'s ``reason``)."""


class Refusal(ValueError):
    """An HTTP 400 of ours whose reason the message alone does not type (a budget, a
    combination of options, no processor): raised with its ``reason``, one of :data:`REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason = reason


_REFUSAL = "_hermes_vllm_refusal"


def mark_refused(error: ValueError, reason: str, path: str) -> None:
    """Note on an admission error that it is ours, why, and where: the check that raises it
    (vLLM's ``validate_params``) is not told the request's id, the door that called it is."""
    setattr(error, _REFUSAL, (reason, path))


def refused(error: BaseException, request_id: str) -> bool:
    """At the door, for an error raised while admitting request ``request_id``: where it is one
    of our refusals, count it and log one line; False where it is not ours."""
    cause: BaseException | None = error
    while cause is not None and not hasattr(cause, _REFUSAL):
        cause = cause.__cause__  # vLLM re-raises a validate_params error as its own, from ours
    if cause is None:
        return False
    noted = getattr(cause, _REFUSAL)
    reason, path = noted
    REFUSED.inc(reason)
    events.info("hermes-vllm: refused request %s: reason=%s path=%s: %s", request_id, reason, path, cause)
    return True


@dataclass(frozen=True)
class Series:
    """One series family: ``name`` as Prometheus types it (a counter's samples end ``_total``)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    values: tuple[tuple[str, ...], ...] = ()
    """Per label, every value it takes (a fixed vocabulary); empty where it is open (dialect)."""
    buckets: tuple[float, ...] = ()
    _keys: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def exposed(self) -> tuple[str, ...]:
        """The sample names ``/metrics`` shows for this family."""
        if self.kind == "counter":
            return (self.name + "_total",)
        if self.kind == "histogram":
            return tuple(self.name + s for s in ("_bucket", "_sum", "_count"))
        return (self.name,)

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        """Count ``amount`` under ``labels`` (a counter)."""
        store = _store()
        if store is not None:
            store.add(self._key(labels)[0], amount)

    def observe(self, value: float) -> None:
        """Record one observation (a histogram)."""
        store = _store()
        if store is not None:
            store.observe(self._key(()), bisect.bisect_left(self.buckets, value), value)

    def set(self, value: float) -> None:
        """Set the value (a gauge: the latest of all processes is shown)."""
        store = _store()
        if store is not None:
            store.set(self._key(())[0], value)

    def _key(self, labels: tuple[str, ...]) -> tuple[str, ...]:
        """The file keys of ``labels``: a counter's one; a histogram's per bucket (``+Inf`` last)
        then its sum; a gauge's one. Memoised: a step's write builds no JSON."""
        keys = self._keys.get(labels)
        if keys is None:
            names = dict(zip(self.labels, labels, strict=True))
            if self.kind == "histogram":
                bounds = [*map(floatToGoString, self.buckets), "+Inf"]
                keys = (
                    *(mmap_key(self.name, self.name + "_bucket", ["le"], [b], self.help) for b in bounds),
                    mmap_key(self.name, self.name + "_sum", [], [], self.help),
                )
            else:
                sample = self.exposed[0]
                keys = (mmap_key(self.name, sample, list(names), list(names.values()), self.help),)
            self._keys[labels] = keys
        return keys


_SECONDS_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
_SECONDS_SLOW = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0)

REQUESTS = Series(
    PREFIX + "requests",
    "counter",
    "Requests the constraint served (admitted with tools), by tool_choice and dialect.",
    ("tool_choice", "dialect"),
    (TOOL_CHOICES, ()),
)
CALLS = Series(
    PREFIX + "calls",
    "counter",
    "Tool calls in constrained replies, by how each ended: complete, closed by the budget's "
    "completer (budget_closed), or cut unfinished by max_tokens (cut).",
    ("outcome",),
    (OUTCOMES,),
)
BUDGET_ACTIONS = Series(
    PREFIX + "budget_actions",
    "counter",
    "Times the token budget forced a turn forward: closed a reasoning span, opened the owed "
    "call, or forced the owed final answer.",
    ("action",),
    (ACTIONS,),
)
REFUSED = Series(
    PREFIX + "refused_requests",
    "counter",
    "Requests refused with HTTP 400 by hermes-vllm's admission checks, by reason.",
    ("reason",),
    (REASONS,),
)
TOOLS_LEFT_OUT = Series(
    PREFIX + "tools_left_out",
    "counter",
    "Tools left out of an admitted request's grammar because no call could satisfy their schema.",
)
COMPILE_SECONDS = Series(
    PREFIX + "grammar_compile_seconds",
    "histogram",
    "Wall time of each turn-grammar compile on the engine's compile pool.",
    buckets=_SECONDS_SLOW,
)
CACHE_HITS = Series(
    PREFIX + "grammar_cache_hits",
    "counter",
    "Grammar requests served from the compiled-grammar cache (or joined to a running compile).",
)
CACHE_MISSES = Series(PREFIX + "grammar_cache_misses", "counter", "Grammar requests that started a compile.")
STEP_SECONDS = Series(
    PREFIX + "step_seconds",
    "histogram",
    "CPU time of the logits processor per engine step with at least one constrained row.",
    buckets=_SECONDS_FAST,
)
CONSTRAINED_ROWS = Series(PREFIX + "constrained_rows", "gauge", "Constrained rows in the latest engine step.")

SERIES = (
    REQUESTS, CALLS, BUDGET_ACTIONS, REFUSED, TOOLS_LEFT_OUT, COMPILE_SECONDS, CACHE_HITS, CACHE_MISSES,
    STEP_SECONDS, CONSTRAINED_ROWS,
)  # fmt: skip


def record_step(rows: int, seconds: float) -> None:
    """One engine step's processor time over ``rows`` constrained rows, kept in memory: a
    thread of this process moves the steps to its files every :data:`FLUSH_S` (a write into a
    mapped page now and then takes tens of microseconds, when the kernel tracks it dirty again)."""
    store = _store()
    if store is not None:
        store.step(bisect.bisect_left(STEP_SECONDS.buckets, seconds), seconds, rows)


FLUSH_S = 0.5
"""How often a process's steps reach its files: ``/metrics`` lags the steps by at most this."""


class _Files:
    """This process's three files (prometheus_client's multiprocess format) in ``directory``.

    The gauge file's mode is ``mostrecent``: the value of the process that set it last is shown.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.pid = os.getpid()
        tag = f"hermes-{self.pid}.db"
        self._lock = threading.Lock()  # compile pool threads count too; MmapedDict is not thread safe
        files: Any = mmap_dict.MmapedDict  # untyped
        self._counter = files(os.path.join(directory, f"counter_{tag}"))
        self._histogram = files(os.path.join(directory, f"histogram_{tag}"))
        self._gauge = files(os.path.join(directory, f"gauge_mostrecent_{tag}"))

        self._values: dict[str, float] = {}
        """What this process wrote under each key (only this process writes its files)."""
        self._step_counts = [0] * (len(STEP_SECONDS.buckets) + 1)
        self._step_seconds = 0.0
        self._rows = 0
        self._steps = self._flushed = 0
        self._flusher: threading.Thread | None = None
        for series in SERIES:  # the fixed vocabularies at 0: a dashboard's rate() has a series
            if series.kind == "counter" and not series.labels:
                self.add(series._key(())[0], 0.0)
            elif series.kind == "counter" and all(series.values):
                for labels in itertools.product(*series.values):
                    self.add(series._key(labels)[0], 0.0)

    def add(self, key: str, amount: float) -> None:
        with self._lock:
            value = self._values[key] = self._values.get(key, 0.0) + amount
            self._counter.write_value(key, value, 0.0)

    def observe(self, keys: tuple[str, ...], bucket: int, value: float) -> None:
        """One observation of ``value`` in ``bucket`` (``keys``: the histogram's buckets then its
        sum, every bucket written from the first, as Prometheus expects)."""
        values = self._values
        with self._lock:
            files = self._histogram
            if keys[-1] not in values:
                for key in keys:
                    values[key] = 0.0
                    files.write_value(key, 0.0, 0.0)
            count = values[keys[bucket]] = values[keys[bucket]] + 1
            files.write_value(keys[bucket], count, 0.0)
            total = values[keys[-1]] = values[keys[-1]] + value
            files.write_value(keys[-1], total, 0.0)

    def step(self, bucket: int, seconds: float, rows: int) -> None:
        """One step, in memory only; the engine's thread is its one writer."""
        self._step_counts[bucket] += 1
        self._step_seconds += seconds
        self._rows = rows
        self._steps += 1
        if self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_steps, name="hermes-vllm-metrics", daemon=True
            )
            self._flusher.start()
            atexit.register(self.flush_steps)

    def _flush_steps(self) -> None:
        while True:
            time.sleep(FLUSH_S)
            self.flush_steps()

    def flush_steps(self) -> None:
        """Write the steps taken since the last flush (their buckets, time and latest rows)."""
        steps = self._steps
        if steps == self._flushed:
            return
        counts, seconds, rows = list(self._step_counts), self._step_seconds, self._rows
        keys = STEP_SECONDS._key(())
        with self._lock:
            files = self._histogram
            for key, count in zip(keys, [*counts, seconds], strict=True):
                files.write_value(key, count, 0.0)
            self._gauge.write_value(CONSTRAINED_ROWS._key(())[0], rows, time.time())
        self._flushed = steps

    def set(self, key: str, value: float) -> None:
        with self._lock:
            self._gauge.write_value(key, value, time.time())


_files: _Files | None = None
_looked = False
"""Whether this process looked for a directory (and found :data:`_files`, or none)."""


def directory() -> str | None:
    """Where this process's files go: vLLM's multiprocess directory where set, else ours."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(ENV) or None


def _store() -> _Files | None:
    """This process's files, opened on first use; ``None`` where no directory is set (the
    library used without vLLM's plugin). The one check on every write."""
    return _files if _files is not None or _looked else _open()


_OPENING = threading.Lock()
"""Held while a process opens its files: the engine's thread and the compile pool's count too,
and an event that came while another thread was still opening them was lost (not yet opened, but
already looked for)."""


def _open() -> _Files | None:
    global _files, _looked
    with _OPENING:
        if not _looked:
            where = directory()
            if where is not None and os.path.isdir(where):
                _files = _Files(where)
            _looked = True  # after _files: a reader seeing it set sees the files too
    return _files


def flush() -> None:
    """Write the steps this process keeps in memory now (its thread does every :data:`FLUSH_S`,
    and its exit; a forked child that ends with ``os._exit`` calls this first)."""
    if _files is not None:
        _files.flush_steps()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Record nothing inside: what counting costs is measured against it (``benchmarks/processor.py``
    alternates steps with and without)."""
    global _files, _looked
    saved = _files, _looked
    _files, _looked = None, True
    try:
        yield
    finally:
        _files, _looked = saved


def _forget() -> None:
    """A forked child writes files of its own (its pid), opened on its first write."""
    global _files, _looked
    _files, _looked = None, False


os.register_at_fork(after_in_child=_forget)


def ensure_dir() -> str:
    """This process tree's directory of ours, created (and exported) by the first process that
    loads the plugin, removed when that process exits; inherited by everything it starts."""
    path = os.environ.get(ENV)
    if not path or not os.path.isdir(path):
        path = tempfile.mkdtemp(prefix="hermes-vllm-metrics-")
        os.environ[ENV] = path
        atexit.register(_remove, path, os.getpid())
    return path


def _remove(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked child inherits the atexit hooks
        shutil.rmtree(path, ignore_errors=True)


def collect(where: str | None = None) -> list[Metric]:
    """Our series as summed over every process's files in ``where`` (default: :func:`directory`)."""
    where = where or directory()
    if where is None:
        return []
    files = glob.glob(os.path.join(where, "*_hermes-*.db"))
    merge: Any = multiprocess.MultiProcessCollector.merge  # untyped
    return list(merge(files, accumulate=True))


class Collector:
    """Our series for a registry that does not read multiprocess files itself (a single API
    server's default registry, offline ``get_metrics()``)."""

    def collect(self) -> Iterator[Metric]:
        return iter(collect())

    def describe(self) -> Iterable[Metric]:
        return ()


_installed = False


def install() -> None:
    """Idempotent: export the directory and register :class:`Collector` in the default registry
    (the general plugin calls it in every process)."""
    global _installed, _looked
    ensure_dir()
    if _files is None:
        _looked = False  # an event before the plugin loaded found no directory; now there is one
    if not _installed:
        REGISTRY.register(Collector())
        _installed = True


def samples(families: Iterable[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of collected families, for readers and tests."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in families:
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out
