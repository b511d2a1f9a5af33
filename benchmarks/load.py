"""Load and fault run against a real CPU server on the tiny model (loopback only, bounded).

N concurrent clients send a fixed number of requests, mixed: tool requests through the
``hermes_vllm`` parser (many distinct BFCL tool sets, so the grammar cache churns), bracket-dialect
requests that carry their constraint in ``vllm_xargs`` directly, requests without tools, streaming
and not, malformed tool schemas (must be HTTP 400), and clients that hang up mid-stream.

Reported: requests by kind and outcome, p50/p99 latency, RSS of the server and its engine core
before and after, and the share of returned calls that validate against their schema. Targets: no
server error for well-formed requests, 100% valid calls, RSS growth bounded by the two grammar
caches' limits, no request stuck past the timeout.

Usage: python benchmarks/load.py [--clients 64] [--requests 512] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("tools", "tools_stream", "brackets_xargs", "plain", "plain_stream", "malformed", "disconnect")


@dataclass
class Outcome:
    kind: str
    status: str
    seconds: float
    calls: int = 0
    valid_calls: int = 0
    detail: str = ""


@dataclass
class Workload:
    model: str
    tool_sets: list[list[dict[str, Any]]]
    bias: dict[str, float]
    max_tokens: int
    timeout: float
    outcomes: list[Outcome] = field(default_factory=list)


def openai_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": f} for f in functions]


def check_calls(calls: list[tuple[str, str]], functions: list[dict[str, Any]]) -> tuple[int, int]:
    """(calls, calls whose arguments validate against their tool's normalised schema)."""
    import jsonschema

    from hermes_vllm.schema import normalize_tools

    schemas = {s.name: s.parameters for s in normalize_tools(functions)}
    valid = 0
    for name, arguments in calls:
        try:
            jsonschema.validate(json.loads(arguments), schemas[name])
            valid += 1
        except (KeyError, ValueError, jsonschema.ValidationError):
            pass
    return len(calls), valid


async def one_request(client: Any, work: Workload, kind: str, rng: random.Random) -> Outcome:
    from hermes_vllm import constraint_args
    from hermes_vllm.spans import split_spans

    functions = rng.choice(work.tool_sets)
    messages = [{"role": "user", "content": "Please use a tool."}]
    common: dict[str, Any] = {
        "model": work.model,
        "messages": messages,
        "max_tokens": work.max_tokens,
        "temperature": 1.0,
    }
    start = time.perf_counter()
    calls: list[tuple[str, str]] = []
    if kind in ("tools", "tools_stream"):
        common |= {
            "tools": openai_tools(functions),
            "tool_choice": "required",
            "extra_body": {"logit_bias": work.bias},
        }
    elif kind == "brackets_xargs":
        xargs = constraint_args(functions, "required", dialect="chatml-brackets")
        common |= {"extra_body": {"logit_bias": work.bias, "vllm_xargs": xargs}}
    elif kind == "malformed":
        broken = [
            {"name": "broken", "parameters": {"type": "object", "properties": {"x": {"type": "strnig"}}}}
        ]
        common |= {"tools": openai_tools(broken)}
    if kind in ("tools_stream", "plain_stream", "disconnect"):
        stream = await client.chat.completions.create(stream=True, **common)
        chunks = 0
        pieces: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        async for chunk in stream:
            chunks += 1
            if kind == "disconnect" and chunks == 3:
                await stream.close()
                return Outcome(kind, "hung_up", time.perf_counter() - start)
            for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                if tc.function and tc.function.name:
                    names[tc.index] = tc.function.name
                if tc.function and tc.function.arguments:
                    pieces.setdefault(tc.index, []).append(tc.function.arguments)
        calls = [(names[i], "".join(pieces.get(i, []))) for i in sorted(names)]
    else:
        reply = await client.chat.completions.create(**common)
        message = reply.choices[0].message
        if kind == "brackets_xargs":
            for span in split_spans(message.content or "", "chatml-brackets"):
                if span.kind == "call" and span.closed:
                    payload = json.loads(span.body)
                    calls.append((payload["name"], json.dumps(payload["arguments"])))
        else:
            calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    n, valid = check_calls(calls, functions)
    return Outcome(kind, "ok", time.perf_counter() - start, n, valid)


async def client_loop(url: str, work: Workload, queue: asyncio.Queue[str], seed: int) -> None:
    import openai

    rng = random.Random(seed)
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=work.timeout)
    async with client:
        while True:
            try:
                kind = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            start = time.perf_counter()
            try:
                outcome = await asyncio.wait_for(one_request(client, work, kind, rng), work.timeout)
            except openai.BadRequestError as err:
                outcome = Outcome(kind, "http_400", time.perf_counter() - start, detail=str(err)[:200])
            except TimeoutError:
                outcome = Outcome(kind, "stuck", time.perf_counter() - start)
            except openai.APIError as err:
                elapsed = time.perf_counter() - start
                outcome = Outcome(kind, f"error_{type(err).__name__}", elapsed, detail=str(err)[:200])
            work.outcomes.append(outcome)


def summarize(work: Workload, rss: list[int], cache_bytes: int) -> dict[str, Any]:
    """``rss``: the server tree's RSS at start and after each phase (the first phase warms up)."""
    outcomes = work.outcomes
    latencies = sorted(o.seconds for o in outcomes if o.status == "ok")
    by_kind: dict[str, Counter[str]] = {}
    for o in outcomes:
        by_kind.setdefault(o.kind, Counter())[o.status] += 1
    calls = sum(o.calls for o in outcomes)
    valid = sum(o.valid_calls for o in outcomes)
    # These kinds ask for tool_choice="required": each reply must hold a call (brackets_xargs
    # replies read from the content, which the parsers return as written for a client's own
    # constraint).
    required: dict[str, list[Outcome]] = {k: [] for k in ("tools", "tools_stream", "brackets_xargs")}
    for o in outcomes:
        if o.kind in required and o.status == "ok":
            required[o.kind].append(o)
    with_call = {k: sum(o.calls >= 1 and o.valid_calls == o.calls for o in v) for k, v in required.items()}
    well_formed_errors = sum(
        1 for o in outcomes if o.kind != "malformed" and o.status not in ("ok", "hung_up")
    )
    return {
        "requests": len(outcomes),
        "outcomes": {k: dict(v) for k, v in by_kind.items()},
        "well_formed_errors": well_formed_errors,
        "malformed_rejected_400": by_kind.get("malformed", Counter())["http_400"],
        "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "latency_p99_s": round(latencies[int(0.99 * (len(latencies) - 1))], 3) if latencies else None,
        "tool_calls": calls,
        "valid_tool_calls": valid,
        "valid_share": round(valid / calls, 4) if calls else None,
        "required_replies": {k: len(v) for k, v in required.items()},
        "required_replies_with_valid_call": with_call,
        "rss_mb": [round(r / 2**20, 1) for r in rss],
        "rss_warm_up_mb": round((rss[1] - rss[0]) / 2**20, 1),
        "rss_growth_mb": round((rss[-1] - rss[1]) / 2**20, 1),
        "cache_limit_mb": round(cache_bytes / 2**20, 1),
        "stuck": sum(1 for o in outcomes if o.status == "stuck"),
        "error_details": sorted(
            {f"{o.kind}: {o.detail}" for o in outcomes if o.detail and o.status != "http_400"}
        )[:10],
    }


def run(
    clients: int,
    requests: int,
    max_tokens: int,
    timeout: float,
    cache_mb: int,
    phases: int = 4,
    seed: int = 0,
) -> dict[str, Any]:
    """Serve, drive ``requests`` in ``phases`` equal parts, and sample RSS before and after each.

    The first phase is the warm-up (vocabulary tables, the second engine, allocator arenas): the
    growth that must stay within the caches' limits is the one after it.
    """
    from support.corpus import bfcl_files, load_bfcl
    from support.readings import server_usage
    from transformers import AutoTokenizer

    from hermes_vllm.demo.bias import call_bias
    from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
    from hermes_vllm.testing import tiny_model_path

    model = str(tiny_model_path())
    # Closers only (``"``, ``}``, ``]``), nothing toward a call tag: every tool request is
    # ``required``, and its call must come from the constraint and the token budget, not the bias.
    bias = {str(k): v for k, v in call_bias(AutoTokenizer.from_pretrained(model), ()).items()}
    tool_sets = [case.tools for path in bfcl_files() for case in load_bfcl(path)]
    work = Workload(model, tool_sets, bias, max_tokens, timeout)
    rng = random.Random(seed)
    kinds = [KINDS[i % len(KINDS)] for i in range(requests)]
    rng.shuffle(kinds)
    # Both caches of compiled grammars (ours and xgrammar's rule masks) get ``cache_mb`` each.
    env = {
        **CPU_ENV,
        "HERMES_VLLM_CACHE_BYTES": str(cache_mb << 20),
        "HERMES_VLLM_XGRAMMAR_CACHE_BYTES": str(cache_mb << 20),
    }
    flags = (
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes_vllm",
        "--reasoning-parser",
        "hermes_vllm",
    )
    log = Path(tempfile.mkstemp(prefix="load-server-", suffix=".log")[1])
    with openai_server(
        model, (*flags, *CPU_ARGS, "--max-num-seqs", str(max(clients, 16))), env, log_path=log
    ) as url:
        rss = [server_usage(url).rss_bytes]
        start = time.perf_counter()
        for phase in range(phases):
            queue: asyncio.Queue[str] = asyncio.Queue()
            for kind in kinds[phase * len(kinds) // phases : (phase + 1) * len(kinds) // phases]:
                queue.put_nowait(kind)

            async def drive(queue: asyncio.Queue[str] = queue) -> None:
                await asyncio.gather(*(client_loop(url, work, queue, seed + i) for i in range(clients)))

            asyncio.run(drive())
            rss.append(server_usage(url).rss_bytes)
        elapsed = time.perf_counter() - start
    summary = summarize(work, rss, 2 * cache_mb << 20)
    summary |= {
        "clients": clients,
        "wall_s": round(elapsed, 1),
        "max_tokens": max_tokens,
        "server_log": str(log),
    }
    lines = log.read_text(errors="replace").splitlines()
    serving = lines[: next((i for i, line in enumerate(lines) if "[shutdown]" in line), len(lines))]
    # vLLM logs its own teardown after SIGTERM as errors; only what happened while serving counts.
    server_errors = [line for line in serving if "Traceback" in line or " ERROR " in line]
    summary["server_error_lines"] = server_errors[:10]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds before a request counts as stuck"
    )
    parser.add_argument("--cache-mb", type=int, default=32, help="limit of each grammar cache")
    parser.add_argument("--phases", type=int, default=4, help="RSS is sampled after each; the first warms up")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    summary = run(args.clients, args.requests, args.max_tokens, args.timeout, args.cache_mb, args.phases)
    print(json.dumps(summary, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"load-{args.clients}x{args.requests}.json").write_text(
        json.dumps(summary, indent=2) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main()
