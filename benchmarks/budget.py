"""Token-budget scenarios, ours against vLLM's own constraint in the same run; the cache decision.

Serves the tiny model twice, one server after the other, and sends both the same scenarios
(:mod:`support.budget_scenarios`): ours with ``--tool-call-parser hermes_vllm
--reasoning-parser hermes_vllm``, vLLM's with ``--tool-call-parser hermes --tool-strict-level
parameter --reasoning-parser qwen3``. Each scenario's figure is the replies that kept its promise.

``--cache`` measures where the budget should live: over a trace of requests (agents resending
their tool sets, each request with its own ``thinking_token_budget`` and ``max_tokens``), the
compile-cache hit rate with the budget counted by the processor (cache key: the turn) and with
the budget written into the grammar (key: the turn, the span budget and the reserve's position,
which depends on ``max_tokens``).

Usage: python benchmarks/budget.py [--sets 2] [--cache] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
from collections import OrderedDict
from pathlib import Path
from typing import Any

SERVERS: dict[str, tuple[str, ...]] = {
    "hermes_vllm": ("--tool-call-parser", "hermes_vllm", "--reasoning-parser", "hermes_vllm"),
    "vllm_strict": (
        "--tool-call-parser", "hermes", "--tool-strict-level", "parameter", "--reasoning-parser", "qwen3",
    ),
}  # fmt: skip


def scenarios(sets: int) -> dict[str, dict[str, Any]]:
    from support import budget_scenarios
    from transformers import AutoTokenizer

    from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
    from hermes_vllm.testing import tiny_model_path

    model = tiny_model_path("mistral-v1")
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    report: dict[str, dict[str, Any]] = {}
    for name, flags in SERVERS.items():
        args = [*CPU_ARGS, "--enable-auto-tool-choice", "--seed", "0", *flags]
        with openai_server(model, args, CPU_ENV) as url:
            outcomes = budget_scenarios.run(url, str(model), tokenizer, sets)
        report[name] = {
            k: {
                "ok": o.ok,
                "total": o.total,
                "closed": o.closed,
                "reasoning_tokens": o.reasoning,
                "failures": o.failures[:3],
            }
            for k, o in outcomes.items()
        }
        for scenario, o in outcomes.items():
            print(
                json.dumps({"server": name, "scenario": scenario, "ok": o.ok, "total": o.total}), flush=True
            )
    return report


def cache_hit_rates(requests: int, clients: int, entries: int) -> dict[str, Any]:
    """Hit rates of an LRU of ``entries`` grammars over a trace, keyed both ways."""
    from support.corpus import sample_tool_sets

    rng = random.Random(0)
    tool_sets = [json.dumps(s, sort_keys=True) for s in sample_tool_sets(clients)]
    trace = []
    for _ in range(requests):
        client = rng.randrange(clients)
        budget = rng.choice([None, 256, 512, 1024, 2048])
        max_tokens = rng.choice([256, 512, 1024, 2048, 4096])
        trace.append((tool_sets[client], budget, max_tokens))

    def hit_rate(key: Any) -> float:
        cache: OrderedDict[Any, None] = OrderedDict()
        hits = 0
        for item in trace:
            k = key(item)
            if k in cache:
                hits += 1
                cache.move_to_end(k)
            else:
                cache[k] = None
                if len(cache) > entries:
                    cache.popitem(last=False)
        return hits / len(trace)

    return {
        "requests": requests,
        "clients": clients,
        "entries": entries,
        "processor_counts": round(hit_rate(lambda r: r[0]), 4),
        "grammar_holds_span_budget": round(hit_rate(lambda r: (r[0], r[1])), 4),
        "grammar_holds_budget_and_reserve": round(hit_rate(lambda r: r), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=2, help="BFCL tool sets per scenario")
    parser.add_argument("--cache", action="store_true", help="only the cache-key trace (no servers)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    report: dict[str, Any] = {"cache": cache_hit_rates(2048, 64, 256)}
    print(json.dumps(report["cache"]), flush=True)
    if not args.cache:
        report["scenarios"] = scenarios(args.sets)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "budget-cache.json" if args.cache else "budget.json"
    (args.out / name).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
