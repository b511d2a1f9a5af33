"""Our series in the offline engine's ``vllm.LLM(...).get_metrics()``.

vLLM's snapshot (``vllm.v1.metrics.reader.get_metrics_snapshot``) reads the default registry,
where :func:`hermes_vllm.metrics.install` registered our collector, but keeps only the families
named ``vllm:...``; ours are ``hermes_vllm:...``. So ``LLMEngine.get_metrics`` is wrapped to add
ours, built as vLLM's own reader builds its (a counter's value as an integer under the family's
name, a histogram's cumulative buckets by ``le``), from every process's files: the engine core
runs in a process of its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hermes_vllm.metrics import collect
from hermes_vllm.vllm_api import touchpoints, wrap_attribute

_PATCHED = "__hermes_vllm_metrics__"
_SKIPPED = "hermes-vllm: %s: %s; offline get_metrics() leaves out hermes_vllm: series"


def snapshot() -> list[Any]:
    """Our series as ``vllm.v1.metrics.reader`` metrics (``Counter``, ``Gauge``, ``Histogram``)."""
    from vllm.v1.metrics.reader import Counter, Gauge, Histogram

    out: list[Any] = []
    for family in collect():
        if family.type == "counter":
            out += [
                Counter(name=family.name, labels=s.labels, value=int(s.value))
                for s in family.samples
                if s.name.endswith("_total")
            ]
        elif family.type == "gauge":
            out += [Gauge(name=family.name, labels=s.labels, value=s.value) for s in family.samples]
        else:
            by_name = {s.name: s for s in family.samples if not s.name.endswith("_bucket")}
            buckets = {s.labels["le"]: int(s.value) for s in family.samples if s.name.endswith("_bucket")}
            out.append(
                Histogram(
                    name=family.name,
                    labels={},
                    buckets=buckets,
                    count=int(by_name[family.name + "_count"].value),
                    sum=by_name[family.name + "_sum"].value,
                )
            )
    return out


def _wrap_get_metrics(get_metrics: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(get_metrics)
    def wrapped(self: Any) -> Any:
        return [*get_metrics(self), *snapshot()]

    return wrapped


def install() -> bool:
    """Wrap ``LLMEngine.get_metrics`` once per process (idempotent; the general plugin calls it).
    False where this vLLM lacks it (a warning says so)."""
    return wrap_attribute(touchpoints.OFFLINE_METRICS, _SKIPPED, _wrap_get_metrics, _PATCHED)
