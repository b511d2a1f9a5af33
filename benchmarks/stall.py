"""How long constrained requests stall the streams already running, ours against vLLM's own path.

    python benchmarks/stall.py [--tokenizer qwen3] [--streams 8] [--requests 12] [--fresh-stops 6]
        [--out benchmarks/results/stall.json]

Each server (ours: ``--tool-call-parser hermes_vllm_qwen``; vLLM's: ``--tool-call-parser hermes``,
whose ``required`` is its structured outputs' JSON schema) serves the tiny model with the
tokenizer's vocabulary (Qwen 3: 151,936 logits) on the CPU. ``--streams`` plain streaming
requests run (``ignore_eos``, each renewed when it ends); once they stream, ``--requests``
``tool_choice="required"`` requests (one BFCL tool set) go one after another, the last
``--fresh-stops`` of them with 4 ``stop`` strings no request used before (the API's limit). For
each constrained request: the worst gap between two chunks of any plain stream while it ran
(its stall), against the worst gap in as long a window before the first one. The first request
after start-up is where every table built on first use is paid; later ones show what each
request costs the loop, and the ones with fresh stop strings what those cost.

The API server runs its engine core in a process of its own (``VLLM_ENABLE_V1_MULTIPROCESSING``
only moves an offline ``vllm.LLM``'s): a stream's chunk waits for the engine's step and for the API
server's loop, which also admits each constrained request.

Writes PATH.json and PATH.png; the ratio is ours over vLLM's, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
SERVERS: dict[str, tuple[str, ...]] = {
    "hermes_vllm": ("--enable-auto-tool-choice", "--tool-call-parser", "hermes_vllm_qwen"),
    "vllm": ("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}


class Streams:
    """Plain streaming requests kept running; the arrival time of every chunk, per request."""

    def __init__(self, client: Any, model: str, count: int) -> None:
        self.client, self.model, self.count = client, model, count
        self.chunks: list[list[float]] = []
        self.running = True

    async def _one(self, seed: int) -> None:
        while self.running:
            times: list[float] = []
            self.chunks.append(times)
            stream = await self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": f"Tell me a story ({seed})."}],
                max_tokens=1500,
                temperature=1.0,
                seed=seed,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            async for _ in stream:
                times.append(time.perf_counter())
                if not self.running:
                    await stream.close()
                    break

    def start(self) -> list[asyncio.Task[None]]:
        return [asyncio.ensure_future(self._one(i)) for i in range(self.count)]

    def worst_gap(self, start: float, end: float) -> float:
        """The longest wait for a next chunk that overlaps ``start .. end``, over every stream (s)."""
        gaps = [b - a for t in self.chunks for a, b in itertools.pairwise(t) if b > start and a < end]
        return max(gaps, default=0.0)


async def drive(url: str, model: str, streams: int, requests: int, fresh: int) -> dict[str, Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    running = Streams(client, model, streams)
    tasks = running.start()
    while sum(len(t) for t in running.chunks) < streams * 20:  # every stream decoding
        await asyncio.sleep(0.1)
    rows: list[dict[str, Any]] = []
    for i in range(requests):
        stop = [f"STOP-{i}-{k}" for k in range(4)] if i >= requests - fresh else None
        start = time.perf_counter()
        reply = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[TOOL],  # type: ignore[list-item]
            tool_choice="required",
            max_tokens=48,
            temperature=1.0,
            seed=i,
            stop=stop,
        )
        end = time.perf_counter()
        calls = reply.choices[0].message.tool_calls or []
        rows.append(
            {
                "request": i,
                "fresh_stops": stop is not None,
                "seconds": round(end - start, 3),
                "calls": len(calls),
                "worst_gap_ms": round(running.worst_gap(start, end) * 1e3, 1),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    quiet_end = time.perf_counter()
    await asyncio.sleep(max(r["seconds"] for r in rows))
    baseline = running.worst_gap(quiet_end, time.perf_counter())
    running.running = False
    await asyncio.gather(*tasks, return_exceptions=True)
    later = [r["worst_gap_ms"] for r in rows[1:] if not r["fresh_stops"]]
    with_stops = [r["worst_gap_ms"] for r in rows if r["fresh_stops"]]
    return {
        "requests": rows,
        "first_ms": rows[0]["worst_gap_ms"],
        "later_median_ms": statistics.median(later) if later else None,
        "fresh_stops_median_ms": statistics.median(with_stops) if with_stops else None,
        "baseline_ms": round(baseline * 1e3, 1),
    }


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, run in result["servers"].items():
        gaps = [r["worst_gap_ms"] for r in run["requests"]]
        ax.plot(range(1, len(gaps) + 1), gaps, marker="o", label=name)
        ax.axhline(run["baseline_ms"], linestyle=":", linewidth=0.8, color=ax.lines[-1].get_color())
    fresh = result["meta"]["fresh_stops"]
    if fresh:
        ax.axvspan(result["meta"]["requests"] - fresh + 0.5, result["meta"]["requests"] + 0.5, alpha=0.1)
    ax.set_yscale("log")
    ax.set_xlabel("required request, one after another (shaded: 4 fresh stop strings each)")
    ax.set_ylabel("worst gap of the running streams (ms)")
    ax.set_title(f"Stall of {result['meta']['streams']} running streams ({result['meta']['tokenizer']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="qwen3")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--fresh-stops", type=int, default=6)
    parser.add_argument("--out", type=Path, default=RESULTS / "stall.json")
    args = parser.parse_args(argv)

    from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
    from hermes_vllm.testing import tiny_model_path
    from hermes_vllm.testing.tiny_model import DIALECT_OF

    model = str(tiny_model_path(args.tokenizer))
    servers: dict[str, Any] = {}
    ours = {"qwen": "hermes_vllm_qwen"}.get(DIALECT_OF.get(args.tokenizer, "hermes"), "hermes_vllm")
    for name, flags in SERVERS.items():  # one server at a time: the machine has 2 cores
        flags = tuple(ours if f == "hermes_vllm_qwen" else f for f in flags)
        served = (*flags, *CPU_ARGS, "--max-num-seqs", str(args.streams + 4))
        with openai_server(model, served, CPU_ENV) as url:
            servers[name] = asyncio.run(drive(url, model, args.streams, args.requests, args.fresh_stops))
        print(name, json.dumps({k: v for k, v in servers[name].items() if k != "requests"}), flush=True)
    ours, theirs = servers["hermes_vllm"], servers["vllm"]
    ratios = {
        key: round(ours[key] / theirs[key], 2)
        for key in ("first_ms", "later_median_ms", "fresh_stops_median_ms")
        if ours.get(key) and theirs.get(key)
    }
    meta = {
        "tokenizer": args.tokenizer,
        "streams": args.streams,
        "requests": args.requests,
        "fresh_stops": args.fresh_stops,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["python benchmarks/stall.py", *(argv or sys.argv[1:])]),
    }
    result = {"meta": meta, "servers": servers, "ratio_ours_to_vllm": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    chart(result, args.out.with_suffix(".png"))
    print(json.dumps(ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
