"""Our series' recording, engine-free: several processes' files sum up, as on a server.

The server tests (``tests/test_server_metrics.py``) show the same on ``/metrics``; these pin what
each part does: the files of several processes add up (counters, histograms), a gauge shows the
value set last, fixed vocabularies appear at 0, nothing is written without a directory, and a
reply's calls are read by how each ended.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_vllm import metrics
from hermes_vllm.budget import MARK
from hermes_vllm.dialect import get_dialect
from hermes_vllm.parsers.finish_reason import call_outcomes


def _record(directory: str, rows: int) -> None:
    os.environ[metrics.ENV] = directory
    metrics.install()
    metrics.REQUESTS.inc("required", "hermes")
    metrics.CALLS.inc("complete")
    metrics.COMPILE_SECONDS.observe(0.3)
    metrics.record_step(rows, 0.0004)
    metrics.flush()  # a forked child ends with os._exit: no atexit


def test_the_files_of_several_processes_add_up(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    for rows in (3, 5):  # one after the other: the gauge shows the later one (forked: each its own pid)
        child = context.Process(target=_record, args=(str(tmp_path), rows))
        child.start()
        child.join(60)
        assert child.exitcode == 0
    seen = metrics.samples(metrics.collect(str(tmp_path)))
    assert seen[("hermes_vllm:requests_total", (("dialect", "hermes"), ("tool_choice", "required")))] == 2
    assert seen[("hermes_vllm:calls_total", (("outcome", "complete"),))] == 2
    assert seen[("hermes_vllm:calls_total", (("outcome", "cut"),))] == 0
    assert all(seen[("hermes_vllm:refused_requests_total", (("reason", r),))] == 0 for r in metrics.REASONS)
    assert seen[("hermes_vllm:grammar_compile_seconds_count", ())] == 2
    assert seen[("hermes_vllm:grammar_compile_seconds_bucket", (("le", "0.25"),))] == 0
    assert seen[("hermes_vllm:grammar_compile_seconds_bucket", (("le", "0.5"),))] == 2
    assert seen[("hermes_vllm:grammar_compile_seconds_sum", ())] == pytest.approx(0.6)
    assert seen[("hermes_vllm:step_seconds_count", ())] == 2
    assert seen[("hermes_vllm:constrained_rows", ())] == 5
    assert {n for n, _ in seen} == {n for s in metrics.SERIES for n in s.exposed}


def _first_events_at_once(directory: str) -> None:
    os.environ[metrics.ENV] = directory
    metrics.install()
    opening = metrics._Files.__init__

    def slow(self: Any, where: str) -> None:
        time.sleep(0.3)  # opening the files takes a while: a second thread counts meanwhile
        opening(self, where)

    metrics._Files.__init__ = slow  # type: ignore[method-assign, assignment]
    first = threading.Thread(target=metrics.CACHE_MISSES.inc)
    first.start()
    time.sleep(0.05)
    second = threading.Thread(target=metrics.CACHE_HITS.inc)
    second.start()
    first.join()
    second.join()


def test_an_event_while_another_thread_opens_the_files_is_counted(tmp_path: Path) -> None:
    """The engine's thread and the compile pool's both count: the first event of a process opens
    its files, and one that came from another thread meanwhile was lost (a server's grammar cache
    hits and misses once summed to one less than the requests admitted)."""
    child = multiprocessing.get_context("fork").Process(target=_first_events_at_once, args=(str(tmp_path),))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    seen = metrics.samples(metrics.collect(str(tmp_path)))
    assert seen[("hermes_vllm:grammar_cache_misses_total", ())] == 1
    assert seen[("hermes_vllm:grammar_cache_hits_total", ())] == 1


def _paused(directory: str) -> None:
    os.environ[metrics.ENV] = directory
    metrics.install()
    with metrics.paused():
        metrics.REQUESTS.inc("auto", "hermes")
    metrics.REQUESTS.inc("none", "hermes")


def test_paused_records_nothing(tmp_path: Path) -> None:
    child = multiprocessing.get_context("fork").Process(target=_paused, args=(str(tmp_path),))
    child.start()
    child.join(60)
    seen = metrics.samples(metrics.collect(str(tmp_path)))
    assert ("hermes_vllm:requests_total", (("dialect", "hermes"), ("tool_choice", "auto"))) not in seen
    assert seen[("hermes_vllm:requests_total", (("dialect", "hermes"), ("tool_choice", "none")))] == 1


def test_a_replys_calls_are_read_by_how_each_ended() -> None:
    hermes = get_dialect("hermes")
    call = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    text = f"<think><tool_call>not a call</tool_call></think>{call} {call}{MARK}<tool_call>" + '{"name": "f'
    assert call_outcomes(text, hermes) == ["complete", "budget_closed", "cut"]
    assert call_outcomes("no calls", hermes) == []
