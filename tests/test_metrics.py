"""Our series' recording, engine-free: several processes' files sum up, as on a server.

The server tests (``tests/test_server_metrics.py``) show the same on ``/metrics``; these pin what
each part does: the files of several processes add up (counters, histograms), a gauge shows the
value set last, fixed vocabularies appear at 0, nothing is written without a directory, and a
reply's calls are read by how each ended.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

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
