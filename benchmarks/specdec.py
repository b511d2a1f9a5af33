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

The replays measure the constraints alone, without the model's time around them: outputs are fed
again to fresh grammars in the order vLLM's scheduler calls them under drafts (each step: accept
the kept tokens, validate the next drafts, then ``grammar_bitmask``: fill and accept each draft,
fill the bonus row, roll back), every draft kept, the fastest of ``--replay N`` rounds (0: none);
microseconds per output token, per method and in total.

- ``replay_same_outputs``: both kinds on the *same* outputs, calls of the prompt's tool that both
  grammars take whole (:data:`SAME_CALLS`), at each ``--batches`` size (rows interleaved step by
  step, as the scheduler does) and each ``--replay-drafts`` count; ``ratio`` is ours / vLLM's.
- ``replay_us_per_token``: each kind's own greedy output from the last engine pass (the two
  differ: the tiny random model writes a long string under ours and whitespace under vLLM's tag).

``--passes 0`` runs the same-output replay alone (no engine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
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


SAME_CALLS = (
    "Paris",
    "Saint-Rémy-de-Provence, Bouches-du-Rhône, Provence-Alpes-Côte d'Azur, France, near the Alpilles "
    "hills and the Roman ruins of Glanum, where Van Gogh painted in 1889",
)
"""The cities of the calls both kinds replay: a short call and one with a long string."""


def _counters(llm: Any) -> dict[str, float]:
    wanted = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    return {m.name: float(m.value) for m in llm.get_metrics() if m.name in wanted}


def _protocol(grammars: list[Any], outputs: list[list[int]], drafts: int, bitmask: Any) -> None:
    """The rows' outputs through vLLM's scheduler calls on their grammars, step by step (each
    step: the kept tokens accepted, the next drafts validated, then ``grammar_bitmask``: each
    draft's row filled and the draft accepted, the bonus row filled, the drafts rolled back),
    every draft kept; a grammar that ended is neither filled nor fed, as in vLLM's manager."""
    rows = list(range(len(grammars)))
    done = [0] * len(rows)
    valid: list[list[int]] = [[] for _ in rows]
    while rows:
        index = 0
        for r in rows:  # grammar_bitmask
            grammar = grammars[r]
            advanced = 0
            for token in valid[r]:
                if not grammar.is_terminated():
                    grammar.fill_bitmask(bitmask, index)
                    advanced += grammar.accept_tokens("r", [token])
                index += 1
            if not grammar.is_terminated():
                grammar.fill_bitmask(bitmask, index)
            index += 1
            if advanced:
                grammar.rollback(advanced)
        for r in rows:  # update_from_output: the kept drafts and the bonus token
            kept = outputs[r][done[r] : done[r] + len(valid[r]) + 1]
            grammars[r].accept_tokens("r", kept)
            done[r] += len(kept)
        rows = [r for r in rows if done[r] < len(outputs[r]) and not grammars[r].is_terminated()]
        for r in rows:  # update_draft_token_ids
            valid[r] = grammars[r].validate_tokens(outputs[r][done[r] : done[r] + drafts])


def replay(
    timers: Timers,
    grammars: dict[str, Callable[[], Any]],
    outputs: dict[str, list[list[int]]],
    drafts: int,
    rounds: int,
    bitmask: Any,
) -> dict[str, dict[str, float]]:
    """Microseconds per output token of each kind's grammar methods (timed as ``kind.method``),
    replaying ``outputs[kind]``, one fresh grammar a row; the kinds take turns, round by round,
    and each reports its fastest round (on a shared machine the others' load only ever adds
    time)."""
    best: dict[str, dict[str, float]] = {}
    for n in range(rounds + 1):
        for name, new in grammars.items():
            rows = [new() for _ in outputs[name]]
            timers.take()
            _protocol(rows, outputs[name], drafts, bitmask)
            spent = {k.split(".", 1)[1]: v for k, v in timers.take().items() if k.startswith(f"{name}.")}
            if n and (name not in best or sum(spent.values()) < sum(best[name].values())):
                best[name] = spent  # the first round warms up
    out: dict[str, dict[str, float]] = {}
    for name, spent in best.items():
        count = sum(map(len, outputs[name]))
        per = {k: round(1e6 * v / count, 2) for k, v in sorted(spent.items())}
        out[name] = {**per, "total": round(1e6 * sum(spent.values()) / count, 2)}
    return out


def _grammars(
    tokenizer_name: str, drafts: int, max_tokens: int, *, llm: Any = None
) -> tuple[dict[str, Callable[[], Any]], Any]:
    """A fresh grammar of each kind (ours hosted, vLLM's xgrammar structural tag) for ``drafts``
    drafts, and the served tokenizer: the offline engine's manager where given, else vLLM's own
    xgrammar backend and our row host built from the engine config alone (no engine)."""
    from vllm import SamplingParams
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    from hermes_vllm.processor import speculative
    from hermes_vllm.testing import tiny_model_path

    if llm is not None:
        manager = llm.llm_engine.engine_core.engine_core.structured_output_manager
        backend, tokenizer = manager.backend, llm.get_tokenizer()
    else:
        from support.drafts import NGRAM
        from vllm.engine.arg_utils import EngineArgs
        from vllm.tokenizers import cached_tokenizer_from_config
        from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

        from hermes_vllm.testing.engine import CPU_ENV, triton_assumed

        for key, value in CPU_ENV.items():
            os.environ.setdefault(key, value)
        spec = {**NGRAM, "num_speculative_tokens": drafts}
        args = EngineArgs(
            model=str(tiny_model_path(tokenizer_name)),  # type: ignore[arg-type]
            dtype="float32",
            speculative_config=spec,
        )
        with triton_assumed():
            config = args.create_engine_config()
        tokenizer = cached_tokenizer_from_config(config.model_config)
        backend = XgrammarBackend(
            config, tokenizer=tokenizer, vocab_size=config.model_config.get_vocab_size()
        )
        manager = SimpleNamespace(vllm_config=config)
    ours, structural = _kinds(tokenizer, tokenizer_name, max_tokens)
    return {
        "hermes_vllm": lambda: speculative.host(manager).grammar(SamplingParams(**ours)),
        "vllm_structural_tag": lambda: backend.compile_grammar(
            StructuredOutputOptions.STRUCTURAL_TAG, structural
        ),
    }, tokenizer


def _kinds(tokenizer: Any, tokenizer_name: str, max_tokens: int) -> tuple[dict[str, Any], str]:
    """Our ``SamplingParams`` fields (greedy, ``required``, ``max_tokens``) and vLLM's structural
    tag for the same tool."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    from hermes_vllm import sampling_options

    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=[TOOL])
    tag = get_model_structural_tag(
        "hermes", chat.tools, "required", False, strict_level=ToolStrictLevel.PARAMETER
    )
    assert tag is not None
    options = sampling_options(
        tokenizer, [TOOL], "required", dialect=DIALECT_OF.get(tokenizer_name, "hermes")
    )
    ours = {
        "temperature": 0.0,
        "max_tokens": max_tokens,
        "skip_special_tokens": options.pop("skip_special_tokens", True),
        **options,
    }
    return ours, json.dumps(tag.model_dump())


def same_outputs(tokenizer: Any, grammars: dict[str, Callable[[], Any]]) -> list[list[int]]:
    """:data:`SAME_CALLS` in the served tokenizer, each ending with its stop token; every kind's
    grammar must take each whole and end there (else the replay would not be the same work)."""
    template = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{}"}}}}\n</tool_call>'
    calls = [
        [*tokenizer.encode(template.format(city), add_special_tokens=False), tokenizer.eos_token_id]
        for city in SAME_CALLS
    ]
    for name, new in grammars.items():
        for call in calls:
            grammar = new()
            assert all(grammar.accept_tokens("r", [t]) for t in call) and grammar.is_terminated(), name
    return calls


def replay_same(
    timers: Timers,
    tokenizer_name: str,
    max_tokens: int,
    batches: list[int],
    draft_counts: list[int],
    rounds: int,
) -> dict[str, dict[str, Any]]:
    """Both kinds on :func:`same_outputs`, at each batch size and draft count: us per output token
    per method, and ours / vLLM's in total."""
    out: dict[str, dict[str, Any]] = {}
    for drafts in draft_counts:
        grammars, tokenizer = _grammars(tokenizer_name, drafts, max_tokens)
        calls = same_outputs(tokenizer, grammars)
        for batch in batches:
            bitmask = torch_bitmask(batch * (drafts + 1), tokenizer)
            rows = [calls[i % len(calls)] for i in range(batch)]
            # Fewer rounds for larger batches: each holds batch times the tokens.
            spent = replay(
                timers,
                grammars,
                dict.fromkeys(grammars, rows),
                drafts,
                max(3, rounds // (1 + batch // 16)),
                bitmask,
            )
            ratio = spent["hermes_vllm"]["total"] / spent["vllm_structural_tag"]["total"]
            out[f"{drafts} drafts, batch {batch}"] = {**spent, "ratio": round(ratio, 3)}
            print(f"{drafts} drafts, batch {batch}: {spent} ratio {ratio:.3f}", flush=True)
    return out


def torch_bitmask(rows: int, tokenizer: Any) -> Any:
    """vLLM's bitmask for ``rows`` rows of the served vocabulary (one row per draft position and
    bonus per request, as its manager allocates it)."""
    import xgrammar as xgr

    return xgr.allocate_token_bitmask(rows, len(tokenizer))


def _time_methods(timers: Timers) -> None:
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar

    from hermes_vllm.processor.hosted import HostedGrammar

    for method in ("accept_tokens", "validate_tokens", "rollback", "fill_bitmask"):
        timers.wrap(HostedGrammar, method, f"hermes_vllm.{method}")
        timers.wrap(XgrammarGrammar, method, f"vllm_structural_tag.{method}")


def measure(
    timers: Timers, tokenizer_name: str, requests: int, max_tokens: int, passes: int, drafts: int, rounds: int
) -> dict[str, Any]:
    """The engine passes (tokens/s, acceptance, constraint time in the engine), then each kind's
    own last output replayed."""
    from support.offline import offline_llm
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from hermes_vllm.testing import tiny_model_path

    spec = {**NGRAM, "num_speculative_tokens": drafts}
    llm = offline_llm(tiny_model_path(tokenizer_name), speculative_config=spec, disable_log_stats=False)  # type: ignore[arg-type]
    ours, structural = _kinds(llm.get_tokenizer(), tokenizer_name, max_tokens)
    kinds: dict[str, Callable[[], Any]] = {  # fresh params per pass: the frontend marks ours
        "hermes_vllm": lambda: SamplingParams(**ours),
        "vllm_structural_tag": lambda: SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            skip_special_tokens=ours["skip_special_tokens"],
            structured_outputs=StructuredOutputsParams(structural_tag=structural),
        ),
        "unconstrained": lambda: SamplingParams(
            temperature=0.0, max_tokens=max_tokens, skip_special_tokens=ours["skip_special_tokens"]
        ),
    }
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    acceptance: dict[str, list[float]] = {k: [] for k in kinds}
    constraint_us: dict[str, list[float]] = {k: [] for k in kinds}
    names = list(kinds)
    last: dict[str, list[list[int]]] = {}
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
            last[name] = [list(outputs[0].outputs[0].token_ids)]
    ratios = [a / b for a, b in zip(rates["hermes_vllm"], rates["vllm_structural_tag"], strict=True)]
    grammars, tokenizer = _grammars(tokenizer_name, drafts, max_tokens, llm=llm)
    bitmask = torch_bitmask(drafts + 1, tokenizer)
    return {
        "tokens_per_s": rates,
        "tokens_per_s_median": {k: round(statistics.median(v), 1) for k, v in rates.items()},
        "acceptance_rate": acceptance,
        "acceptance_rate_median": {k: round(statistics.median(v), 3) for k, v in acceptance.items()},
        "constraint_us_per_token_median": {
            k: round(statistics.median(v), 1) for k, v in constraint_us.items()
        },
        "ratio_per_pass": [round(r, 3) for r in ratios],
        "ratio_median": round(statistics.median(ratios), 3),
        "replay_us_per_token": replay(timers, grammars, last, drafts, rounds, bitmask) if rounds else {},
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """The engine passes' tokens/s and acceptance (where run), and the same-output replay's us per
    output token, ours against vLLM's tag at each batch size and draft count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ["tokens_per_s_median", "acceptance_rate_median"] if "tokens_per_s_median" in report else []
    ) + (["replay_same_outputs"] if report.get("replay_same_outputs") else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 3.8), squeeze=False)
    labels = {
        "tokens_per_s_median": "output tokens/s (median)",
        "acceptance_rate_median": "draft acceptance (median)",
    }
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "replay_same_outputs":
            cases = list(report[panel])
            xs = range(len(cases))
            for k, kind in enumerate(("hermes_vllm", "vllm_structural_tag")):
                ax.bar(
                    [x + 0.4 * k for x in xs],
                    [report[panel][c][kind]["total"] for c in cases],
                    0.4,
                    label=kind,
                )
            ax.set_xticks([x + 0.2 for x in xs], [c.replace(", ", "\n") for c in cases], fontsize=7)
            ax.set_ylabel("replay: us per output token (same outputs)")
            ax.legend(fontsize=7)
        else:
            kinds = list(report[panel])
            ax.bar(kinds, [report[panel][k] for k in kinds])
            ax.set_ylabel(labels[panel])
            ax.tick_params(axis="x", labelrotation=15)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"ngram drafts, required, greedy, {report['tokenizer']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="mistral-v1", choices=TOKENIZER_NAMES)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--passes", type=int, default=4, help="engine passes (0: the same-output replay alone)"
    )
    parser.add_argument("--drafts", type=int, default=3, help="num_speculative_tokens of the engine passes")
    parser.add_argument(
        "--replay", type=int, default=20, help="replay rounds of the constraints alone (0: none)"
    )
    parser.add_argument(
        "--batches", type=int, nargs="+", default=[1, 64, 256], help="rows of the same-output replay"
    )
    parser.add_argument(
        "--replay-drafts", type=int, nargs="+", default=[3, 5], help="drafts of the same-output replay"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--stem", default="", help="file name (default specdec-<tokenizer>)")
    args = parser.parse_args()
    timers = Timers()
    _time_methods(timers)
    report: dict[str, Any] = {
        "tokenizer": args.tokenizer,
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "num_speculative_tokens": args.drafts,
        "replay_rounds": args.replay,
    }
    if args.passes:
        report.update(
            measure(
                timers, args.tokenizer, args.requests, args.max_tokens, args.passes, args.drafts, args.replay
            )
        )
    if args.replay:
        report["replay_same_outputs"] = replay_same(
            timers, args.tokenizer, args.max_tokens, args.batches, args.replay_drafts, args.replay
        )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.stem or f"specdec-{args.tokenizer}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot(report, args.out / f"{stem}.png")
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
