"""The Grafana dashboard and the Prometheus alert rules in ``docs/monitoring/`` query our series.

Every ``hermes_vllm:`` name a query reads must be a sample name of :data:`hermes_vllm.metrics.SERIES`,
every label it groups by or matches on must be one of that series' labels (or a histogram's
``le``), and a matched value of a fixed vocabulary must be in it: a renamed series or label
fails here, not on an operator's empty panel. Where Debian's ``promtool`` is installed the rules
are also checked by it (``.ci/run`` installs it with ``prometheus``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes_vllm import metrics

MONITORING = Path(__file__).resolve().parents[1] / "docs" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERTS = MONITORING / "alerts.yml"

_SAMPLE = {name: series for series in metrics.SERIES for name in series.exposed}
_NAME = re.compile(r"hermes_vllm:[a-z_]+")
_SELECTOR = re.compile(r"(hermes_vllm:[a-z_]+)\{([^}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def dashboard_queries() -> list[str]:
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]


def alert_queries() -> list[str]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [rule["expr"] for g in groups for rule in g["rules"]]


def problems(expr: str) -> list[str]:
    """What in ``expr`` names no series, label or value of ours."""
    found = []
    names = _NAME.findall(expr)
    if not names:
        found.append("reads no hermes_vllm: series")
    for name in names:
        if name not in _SAMPLE:
            found.append(f"{name}: no such series")
    labels = {label for name in names if name in _SAMPLE for label in _SAMPLE[name].labels}
    if any(name.endswith("_bucket") for name in names):
        labels.add("le")
    for grouped in _GROUPING.findall(expr):
        found += [
            f"by {g}: no such label" for g in (x.strip() for x in grouped.split(",")) if g and g not in labels
        ]
    for name, matchers in _SELECTOR.findall(expr):
        series = _SAMPLE.get(name)
        if series is None:
            continue
        for label, op, value in _MATCHER.findall(matchers):
            if label not in series.labels:
                found.append(f"{name}{{{label}}}: no such label")
                continue
            vocabulary = series.values[series.labels.index(label)]
            wanted = value.split("|") if op in ("=~", "!~") else [value]
            found += [
                f"{name}{{{label}={v!r}}}: not a value" for v in wanted if vocabulary and v not in vocabulary
            ]
    return found


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_query_reads_our_series(source: str) -> None:
    queries = dashboard_queries() if source == "dashboard" else alert_queries()
    assert queries
    bad = {q: p for q in queries if (p := problems(q))}
    assert not bad, bad


def test_the_dashboard_shows_every_series() -> None:
    read = {name for q in dashboard_queries() for name in _NAME.findall(q)}
    assert {_SAMPLE[name].name for name in read} == {s.name for s in metrics.SERIES}


def test_a_renamed_series_or_label_is_found() -> None:
    """The checker itself: each kind of mistake is reported."""
    assert problems("rate(hermes_vllm:request_total[5m])") == ["hermes_vllm:request_total: no such series"]
    assert problems("sum by (reason) (rate(hermes_vllm:calls_total[5m]))") == ["by reason: no such label"]
    assert problems('hermes_vllm:calls_total{outcome="closed"}') == [
        "hermes_vllm:calls_total{outcome='closed'}: not a value"
    ]


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)"
)
def test_promtool_accepts_the_rules() -> None:
    done = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
