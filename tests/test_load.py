"""The load-and-fault script, small: every target holds on a real server.

``benchmarks/load.py`` with 6 clients and 35 requests mixing tool requests (distinct BFCL tool sets
with a 4 MiB grammar cache, so entries are evicted), bracket-dialect requests, plain requests,
streams, malformed schemas and clients hanging up mid-stream. docs/measured.md records a 64-client run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "load.py"


def test_load_targets_hold() -> None:
    spec = importlib.util.spec_from_file_location("load_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    load = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = load  # its dataclasses look their module up there
    spec.loader.exec_module(load)
    summary = load.run(clients=6, requests=35, max_tokens=120, timeout=240.0, cache_mb=4, phases=2)
    assert summary["requests"] == 35
    assert summary["well_formed_errors"] == 0, summary["outcomes"]
    assert summary["stuck"] == 0
    assert summary["malformed_rejected_400"] == 5
    assert summary["tool_calls"] > 0 and summary["valid_share"] == 1.0
    assert summary["rss_growth_mb"] < 64, "server memory must stay bounded"
    assert summary["server_error_lines"] == [], summary["server_log"]
