"""Our series on the real OpenAI server's ``/metrics``, and scraped by a real Prometheus.

The server runs as documented (``--tool-call-parser hermes_vllm``), its engine core in a process
of its own (``VLLM_ENABLE_V1_MULTIPROCESSING=1``), so admission and replies are counted in the API
server and compiles, budgets and steps in the engine core. It serves a known mix
(:func:`send_mix`): ``required`` requests whose call the model opens by itself, ``auto``
requests (one carrying a tool no call can satisfy, left out), one ``required`` request at the
smallest ``max_tokens`` admitted (the budget opens its call at the first token), and requests
refused for two reasons. Every series must equal what was sent; how each call ended is read
from the replies (a call the budget closed carries the mark in the content).

With ``--api-server-count 2`` vLLM runs Prometheus multiprocess mode: the same mix gives the
same values, from whichever API server answers the scrape.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import BadRequestError, OpenAI
from prometheus_client.parser import text_string_to_metric_families
from support.api_servers import api_servers as several_api_servers
from support.budget_scenarios import WEATHER, reserve

from hermes_vllm import metrics
from hermes_vllm.budget import MARK
from hermes_vllm.demo.bias import call_bias
from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, free_port, openai_server
from hermes_vllm.testing import tiny_model_path

pytestmark = pytest.mark.server

N_REQUIRED = 3
M_AUTO = 2
UNSATISFIABLE = {
    "type": "function",
    "function": {
        "name": "broken",
        "parameters": {
            "type": "object",
            "properties": {"x": {"type": "array", "enum": ["a"]}},
            "required": ["x"],
        },
    },
}
MESSAGES = [{"role": "user", "content": "Please help."}]
Sample = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class Served:
    url: str
    model: str
    log: Path
    expected: dict[Sample, float]
    """What the mix must show (samples of ours not listed must be 0)."""
    admitted: int

    @property
    def metrics_url(self) -> str:
        return self.url.removesuffix("/v1") + "/metrics"


def _key(name: str, **labels: str) -> Sample:
    return name, tuple(sorted(labels.items()))


def send_mix(url: str, model: str) -> tuple[dict[Sample, float], int]:
    """Serve the mix; the values every series must show, and the requests admitted."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    client = OpenAI(base_url=url, api_key="x", max_retries=0)
    push = {str(k): v for k, v in call_bias(tokenizer).items()}
    need = reserve(tokenizer, [WEATHER], "required")
    asked: list[dict[str, Any]] = [
        {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 200, "logit_bias": push}
    ] * N_REQUIRED
    asked += [{"tools": [WEATHER, UNSATISFIABLE], "max_tokens": 8}]
    asked += [{"tools": [WEATHER], "max_tokens": 8}] * (M_AUTO - 1)
    asked += [{"tools": [WEATHER], "tool_choice": "required", "max_tokens": need, "logit_bias": push}]
    outcomes = {"complete": 0, "budget_closed": 0}
    for seed, kwargs in enumerate(asked):
        reply = client.chat.completions.create(
            model=model, messages=MESSAGES, temperature=1.0, seed=seed, parallel_tool_calls=False, **kwargs
        )  # type: ignore[call-overload]
        message = reply.choices[0].message
        closed = (message.content or "").count(MARK)
        outcomes["budget_closed"] += closed
        outcomes["complete"] += len(message.tool_calls or []) - closed
    refused = [
        ("budget_too_small", {"tools": [WEATHER], "tool_choice": "required", "max_tokens": need - 1}),
        ("unsatisfiable_schema", {"tools": [UNSATISFIABLE], "tool_choice": "required", "max_tokens": 50}),
    ]
    for _, kwargs in refused:
        with pytest.raises(BadRequestError):
            client.chat.completions.create(model=model, messages=MESSAGES, **kwargs)  # type: ignore[call-overload]
    expected = {
        _key("hermes_vllm:requests_total", tool_choice="required", dialect="hermes"): N_REQUIRED + 1,
        _key("hermes_vllm:requests_total", tool_choice="auto", dialect="hermes"): M_AUTO,
        _key("hermes_vllm:tools_left_out_total"): 1,
        _key("hermes_vllm:budget_actions_total", action="call_opened"): 1,
        **{_key("hermes_vllm:calls_total", outcome=o): n for o, n in outcomes.items()},
        **{_key("hermes_vllm:refused_requests_total", reason=r): 1 for r, _ in refused},
    }
    assert sum(outcomes.values()) == N_REQUIRED + 1, outcomes  # one call a required reply
    return expected, len(asked)


def scrape(url: str) -> dict[Sample, float]:
    """Our samples on ``/metrics`` (Prometheus's text format, parsed by prometheus_client)."""
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    out: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(metrics.PREFIX):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def check(seen: dict[Sample, float], served: Served) -> None:
    """Every series equals the mix: the listed ones their value, the other counters 0; the
    compiles, the cache and the steps as the admitted requests imply."""
    counters = {k: v for k, v in seen.items() if k[0].endswith("_total") and "grammar_cache" not in k[0]}
    assert {k: v for k, v in counters.items() if v} == {k: v for k, v in served.expected.items() if v}
    hits = seen[_key("hermes_vllm:grammar_cache_hits_total")]
    misses = seen[_key("hermes_vllm:grammar_cache_misses_total")]
    assert hits + misses == served.admitted and misses >= 1, (hits, misses)
    assert seen[_key("hermes_vllm:grammar_compile_seconds_count")] == misses
    assert seen[_key("hermes_vllm:grammar_compile_seconds_bucket", le="+Inf")] == misses
    assert seen[_key("hermes_vllm:step_seconds_count")] >= served.admitted
    assert seen[_key("hermes_vllm:step_seconds_sum")] > 0
    assert seen[_key("hermes_vllm:constrained_rows")] >= 1
    names = {name for name, _ in seen}
    assert names >= {n for s in metrics.SERIES for n in s.exposed}, names


@contextlib.contextmanager
def mixed_server(tmp: Path, api_servers: int) -> Iterator[Served]:
    model = str(tiny_model_path("mistral-v1"))
    args = [*CPU_ARGS, "--enable-auto-tool-choice", "--tool-call-parser", "hermes_vllm", "--seed", "0"]
    env = {**CPU_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    env[metrics.ENV] = str(tmp / "metrics")  # this server's own directory, whatever the session ran
    (tmp / "metrics").mkdir()
    log = tmp / "server.log"
    with (
        openai_server(model, args, env, log_path=log)
        if api_servers == 1
        else several_api_servers(model, api_servers, args, {**os.environ, **env}, log)
    ) as url:
        expected, admitted = send_mix(url, model)
        yield Served(url, model, log, expected, admitted)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with mixed_server(tmp_path_factory.mktemp("metrics"), 1) as s:
        yield s


def test_metrics_show_the_mix_sent(served: Served) -> None:
    check(scrape(served.metrics_url), served)


def test_each_refusal_is_one_log_line_with_its_reason_and_path(served: Served) -> None:
    lines = [
        line for line in served.log.read_text(encoding="utf-8").splitlines() if "refused request" in line
    ]
    assert len(lines) == 2, lines
    assert "reason=budget_too_small path=-" in lines[0]
    assert "reason=unsatisfiable_schema path=tool 'broken': parameters/properties/x/enum" in lines[1], lines[
        1
    ]
    assert all("refused request chatcmpl-" in line for line in lines), lines


def test_two_api_servers_show_the_same_mix(tmp_path: Path) -> None:
    """``--api-server-count 2``: Prometheus multiprocess mode; each scrape (either server) holds
    the whole mix, counted in both API servers and the engine core."""
    with mixed_server(tmp_path, 2) as s:
        for _ in range(4):
            check(scrape(s.metrics_url), s)
        assert not list((tmp_path / "metrics").iterdir()), "our own directory is unused in multiprocess mode"


PROMETHEUS = shutil.which("prometheus")


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_a_real_prometheus_scrapes_the_mix(served: Served, tmp_path: Path) -> None:
    """Debian's ``prometheus`` (``.ci/run`` installs it) scrapes the server on the loopback; its
    query API returns each series as sent."""
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is not installed (apt-get install prometheus; .ci/run does)")
    target = urllib.parse.urlsplit(served.metrics_url).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        f"scrape_configs: [{{job_name: vllm, static_configs: [{{targets: ['{target}']}}]}}]\n",
        encoding="utf-8",
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}"]
    cmd += [f"--web.listen-address=127.0.0.1:{port}"]
    with (tmp_path / "prometheus.log").open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        seen: dict[Sample, float] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, AssertionError, KeyError):
                results = _query(base, '{__name__=~"hermes_vllm:.*"}')
                seen = {
                    _key(
                        r["metric"].pop("__name__"),
                        **{k: v for k, v in r["metric"].items() if k not in ("job", "instance")},
                    ): float(r["value"][1])
                    for r in results
                }
                if seen:
                    break
            time.sleep(0.5)
        assert seen, (tmp_path / "prometheus.log").read_text(encoding="utf-8")[-2000:]
        check(seen, served)
        rate = _query(base, "sum(hermes_vllm:refused_requests_total)")
        assert float(rate[0]["value"][1]) == 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)
