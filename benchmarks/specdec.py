"""Tool calls with ngram speculative decoding: output tokens/s and draft acceptance, ours against
vLLM's own structured outputs with the same drafts and the same tool, in the same engine.

Offline, ``tool_choice="required"``, greedy (acceptance is then a property of the constraint and
the proposer, not of sampling noise), on the tiny random model, with a prompt the ngram proposer
can copy calls from. Passes alternate which kind runs first; each pass reports tokens/s and the
share of drafted tokens the target accepted (from vLLM's own spec-decode counters), and the time
each constraint spends in its machinery per output token (ours: the hosted row's methods; vLLM's:
its xgrammar grammar's; both inside ``StructuredOutputManager``). ``unconstrained`` runs the same
requests with drafts and no constraint. ``python benchmarks/specdec.py`` writes
``results/specdec-<tokenizer>.json`` and ``.png``.

The replay (``replay_us_per_token``: the fastest of ``--replay N`` rounds, 0: none) measures the
constraints alone, without the model's time around them: each kind's greedy output from the last
pass is fed again to a fresh grammar of the same engine's structured-output manager, in vLLM's
draft order (validate the next drafts, fill and accept each, fill the bonus row, roll back, accept
the kept tokens with the next one), every draft kept: microseconds per output token, per method.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.drafts import COPYABLE_PROMPT, NGRAM
from support.timers import Timers

from hermes_vllm.testing.tiny_model import DIALECT_OF, TOKENIZER_NAMES

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _counters(llm: Any) -> dict[str, float]:
    wanted = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    return {m.name: float(m.value) for m in llm.get_metrics() if m.name in wanted}


def _protocol(grammar: Any, tokens: list[int], drafts: int, bitmask: Any) -> None:
    """One request's output through vLLM's scheduler calls on its grammar, every draft kept."""
    grammar.fill_bitmask(bitmask, 0)
    grammar.accept_tokens("r", tokens[:1])
    i = 1
    while i < len(tokens) and not grammar.is_terminated():
        valid = grammar.validate_tokens(tokens[i : i + drafts])
        for j, token in enumerate(valid):
            grammar.fill_bitmask(bitmask, j)
            grammar.accept_tokens("r", [token])
        grammar.fill_bitmask(bitmask, len(valid))
        if valid:
            grammar.rollback(len(valid))
        kept = tokens[i : i + len(valid) + 1]
        grammar.accept_tokens("r", kept)
        i += len(kept)


def replay(
    llm: Any,
    timers: Timers,
    grammars: dict[str, Callable[[], Any]],
    outputs: dict[str, list[int]],
    drafts: int,
    rounds: int,
) -> dict[str, dict[str, float]]:
    """Microseconds per output token of each kind's grammar methods (timed as ``kind.method``),
    replaying its own output; the kinds take turns, round by round, and each reports its fastest
    round (on a shared machine the others' load only ever adds time)."""
    manager = llm.llm_engine.engine_core.engine_core.structured_output_manager
    bitmask = manager.backend.allocate_token_bitmask(drafts + 1)
    best: dict[str, dict[str, float]] = {}
    for n in range(rounds + 1):
        for name, new in grammars.items():
            timers.take()
            _protocol(new(), outputs[name], drafts, bitmask)
            spent = {k.split(".", 1)[1]: v for k, v in timers.take().items() if k.startswith(f"{name}.")}
            if n and (name not in best or sum(spent.values()) < sum(best[name].values())):
                best[name] = spent  # the first round warms up
    out: dict[str, dict[str, float]] = {}
    for name, spent in best.items():
        count = len(outputs[name])
        per = {k: round(1e6 * v / count, 1) for k, v in sorted(spent.items())}
        out[name] = {**per, "total": round(1e6 * sum(spent.values()) / count, 1)}
    return out


def measure(
    tokenizer_name: str, requests: int, max_tokens: int, passes: int, drafts: int, rounds: int = 0
) -> dict[str, Any]:
    from support.offline import offline_llm
    from vllm import SamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    from hermes_vllm import sampling_options
    from hermes_vllm.processor import speculative
    from hermes_vllm.processor.hosted import HostedGrammar
    from hermes_vllm.testing import tiny_model_path

    timers = Timers()
    for method in ("accept_tokens", "validate_tokens", "rollback", "fill_bitmask"):
        timers.wrap(HostedGrammar, method, f"hermes_vllm.{method}")
        timers.wrap(XgrammarGrammar, method, f"vllm_structural_tag.{method}")
    spec = {**NGRAM, "num_speculative_tokens": drafts}
    llm = offline_llm(tiny_model_path(tokenizer_name), speculative_config=spec, disable_log_stats=False)  # type: ignore[arg-type]
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=[TOOL])
    tag = get_model_structural_tag(
        "hermes", chat.tools, "required", False, strict_level=ToolStrictLevel.PARAMETER
    )
    assert tag is not None
    options = sampling_options(
        llm.get_tokenizer(), [TOOL], "required", dialect=DIALECT_OF.get(tokenizer_name, "hermes")
    )
    common: dict[str, Any] = {
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "skip_special_tokens": options.pop("skip_special_tokens", True),
    }
    structural = json.dumps(tag.model_dump())
    kinds: dict[str, Callable[[], Any]] = {  # fresh params per pass: the frontend marks ours
        "hermes_vllm": lambda: SamplingParams(**common, **options),
        "vllm_structural_tag": lambda: SamplingParams(
            **common, structured_outputs=StructuredOutputsParams(structural_tag=structural)
        ),
        "unconstrained": lambda: SamplingParams(**common),
    }
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    acceptance: dict[str, list[float]] = {k: [] for k in kinds}
    constraint_us: dict[str, list[float]] = {k: [] for k in kinds}
    names = list(kinds)
    last: dict[str, list[int]] = {}
    for n in range(passes + 1):
        for name in names[n % 3 :] + names[: n % 3]:
            before = _counters(llm)
            timers.take()
            start = time.perf_counter()
            outputs = llm.generate([COPYABLE_PROMPT] * requests, kinds[name](), use_tqdm=False)
            wall = time.perf_counter() - start
            spent = timers.take()
            after = _counters(llm)
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            drafted = after.get("vllm:spec_decode_num_draft_tokens", 0.0) - before.get(
                "vllm:spec_decode_num_draft_tokens", 0.0
            )
            accepted = after.get("vllm:spec_decode_num_accepted_tokens", 0.0) - before.get(
                "vllm:spec_decode_num_accepted_tokens", 0.0
            )
            if n:  # the first pass warms up (compiles, caches)
                rates[name].append(round(tokens / wall, 1))
                acceptance[name].append(round(accepted / drafted, 3) if drafted else 0.0)
                seconds = sum(v for k, v in spent.items() if k.startswith(f"{name}."))
                constraint_us[name].append(round(1e6 * seconds / tokens, 1))
            last[name] = list(outputs[0].outputs[0].token_ids)
    ratios = [a / b for a, b in zip(rates["hermes_vllm"], rates["vllm_structural_tag"], strict=True)]
    manager = llm.llm_engine.engine_core.engine_core.structured_output_manager
    grammars: dict[str, Callable[[], Any]] = {
        "hermes_vllm": lambda: speculative.host(manager).grammar(kinds["hermes_vllm"]()),
        "vllm_structural_tag": lambda: manager.backend.compile_grammar(
            StructuredOutputOptions.STRUCTURAL_TAG, structural
        ),
    }
    replayed = replay(llm, timers, grammars, last, drafts, rounds) if rounds else {}
    return {
        "tokenizer": tokenizer_name,
        "requests": requests,
        "max_tokens": max_tokens,
        "num_speculative_tokens": drafts,
        "tokens_per_s": rates,
        "tokens_per_s_median": {k: round(statistics.median(v), 1) for k, v in rates.items()},
        "acceptance_rate": acceptance,
        "acceptance_rate_median": {k: round(statistics.median(v), 3) for k, v in acceptance.items()},
        "constraint_us_per_token_median": {
            k: round(statistics.median(v), 1) for k, v in constraint_us.items()
        },
        "ratio_per_pass": [round(r, 3) for r in ratios],
        "ratio_median": round(statistics.median(ratios), 3),
        "replay_rounds": rounds,
        "replay_us_per_token": replayed,
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(report["tokens_per_s_median"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    left.bar(kinds, [report["tokens_per_s_median"][k] for k in kinds])
    left.set_ylabel("output tokens/s (median)")
    right.bar(kinds, [report["acceptance_rate_median"][k] for k in kinds])
    right.set_ylabel("draft acceptance rate (median)")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=15)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(
        f"ngram drafts ({report['num_speculative_tokens']}), required, greedy, {report['tokenizer']}, "
        f"{report['requests']} requests"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="mistral-v1", choices=TOKENIZER_NAMES)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--drafts", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument(
        "--replay", type=int, default=20, help="replay rounds of the constraints alone (0: none)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    report = measure(args.tokenizer, args.requests, args.max_tokens, args.passes, args.drafts, args.replay)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"specdec-{args.tokenizer}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot(report, args.out / f"{stem}.png")
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
