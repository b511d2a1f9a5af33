"""Grammar drafts: engine steps per completed call, draft acceptance and output tokens/s, ours
with and without grammar drafts against vLLM's structural tag with the same ngram drafter.

Offline, greedy, one engine with ngram drafts, on the tiny random model (``--model random``: a
prompt that lists the tools) or the demo's trained model (``--model trained``: its chat template's
prompt for a BFCL question); ``required`` and named requests over BFCL tool sets (one set a
request, :func:`support.corpus.sample_tool_sets`), 16 and 64 at once. No call to copy in the
prompt: the ngram proposer finds little, so what is accepted inside calls comes from the
grammar's forced runs. Kinds:
``hermes_vllm`` (grammar drafts on), ``hermes_vllm_no_grammar_drafts`` (``grammar_drafts=0``,
the proposer's drafts only) and ``vllm_structural_tag`` (``--tool-call-parser hermes
--tool-strict-level parameter``'s tag through vLLM's structured outputs). Engine steps are the
scheduler's steps that ran the model, to finish the batch; ``steps_per_call`` is that times the requests,
over the calls completed. ``python benchmarks/grammar_drafts.py [--whitespace 0] [--model trained]`` writes
``results/grammar-drafts-ws<N>[-trained].json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.drafts import NGRAM

KINDS = ("hermes_vllm", "hermes_vllm_no_grammar_drafts", "vllm_structural_tag")


def _prompt(tools: list[dict[str, Any]]) -> str:
    listed = "\n".join(json.dumps(t["function"]) for t in tools)
    return (
        f"<|im_start|>system\nYou may call these tools:\n<tools>\n{listed}\n</tools><|im_end|>\n"
        "<|im_start|>user\nPlease help.<|im_end|>\n<|im_start|>assistant\n"
    )


def _counters(llm: Any) -> dict[str, float]:
    wanted = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    return {m.name: float(m.value) for m in llm.get_metrics() if m.name in wanted}


def _closed_calls(text: str) -> int:
    from hermes_vllm.spans import split_spans

    return sum(1 for s in split_spans(text, "hermes") if s.kind == "call" and s.closed)


def measure(
    concurrency: tuple[int, ...],
    max_tokens: int,
    drafts: int,
    model: str,
    save: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    from support.corpus import UNSATISFIABLE_BFCL_TOOL, sample_tool_sets
    from support.offline import offline_llm
    from vllm import SamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    from hermes_vllm import sampling_options, settings
    from hermes_vllm.demo import trained_model
    from hermes_vllm.demo.bfcl import as_openai_tool
    from hermes_vllm.testing import tiny_model_path

    spec = {**NGRAM, "num_speculative_tokens": drafts}
    path = trained_model.trained_model_path() if model == "trained" else tiny_model_path("mistral-v1")
    llm = offline_llm(path, speculative_config=spec, disable_log_stats=False, max_num_seqs=64)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    steps = [0]
    schedule = scheduler.schedule

    def counted(*args: Any, **kwargs: Any) -> Any:
        """Steps that run the model (an engine step may schedule nothing while grammars compile)."""
        out = schedule(*args, **kwargs)
        steps[0] += out.total_num_scheduled_tokens > 0
        return out

    scheduler.schedule = counted
    tokenizer = llm.get_tokenizer()
    if model == "trained":
        items = trained_model.held_out_items()
        sets = [item.tools for item in items]
        questions = [item.messages for item in items]
    else:
        sets = [
            [as_openai_tool(f) for f in functions]
            for functions in sample_tool_sets(2 * max(concurrency), seed=3)
            if not any(f["name"] == UNSATISFIABLE_BFCL_TOOL for f in functions)
        ]
        questions = []

    def prompt(i: int) -> str:
        if not questions:
            return _prompt(sets[i])
        text = tokenizer.apply_chat_template(
            questions[i], tools=sets[i], add_generation_prompt=True, tokenize=False
        )
        assert isinstance(text, str)
        return text

    # The tool sets whose prompt leaves room for the reply in the engine's context.
    room = llm.llm_engine.model_config.max_model_len - max_tokens
    fits = [i for i in range(len(sets)) if len(tokenizer.encode(prompt(i))) <= room]
    sets, questions = [sets[i] for i in fits], [questions[i] for i in fits] if questions else []

    def params(kind: str, tools: list[dict[str, Any]], choice: Any) -> SamplingParams:
        common: dict[str, Any] = {"temperature": 0.0, "max_tokens": max_tokens}
        if kind == "vllm_structural_tag":
            chat = ChatCompletionRequest(
                model="m", messages=[{"role": "user", "content": "hi"}], tools=tools, tool_choice=choice
            )
            tag = get_model_structural_tag(
                "hermes", chat.tools, chat.tool_choice, False, strict_level=ToolStrictLevel.PARAMETER
            )
            assert tag is not None
            outputs = StructuredOutputsParams(structural_tag=json.dumps(tag.model_dump()))
            return SamplingParams(**common, structured_outputs=outputs, skip_special_tokens=False)
        options = sampling_options(tokenizer, tools, choice)
        return SamplingParams(**common, **options)

    runs: list[dict[str, Any]] = []
    for n in concurrency:
        for choice_name in ("required", "named"):
            batch = sets[:n]
            choices = [
                "required"
                if choice_name == "required"
                else {"type": "function", "function": {"name": t[0]["function"]["name"]}}
                for t in batch
            ]
            prompts = [prompt(i) for i in range(len(batch))]
            for kind in ("hermes_vllm", *KINDS):  # the first run warms up (compiles)
                os.environ["HERMES_VLLM_GRAMMAR_DRAFTS"] = "0" if kind.endswith("no_grammar_drafts") else "1"
                settings.get_limits.cache_clear()
                todo = [params(kind, t, c) for t, c in zip(batch, choices, strict=True)]
                before = _counters(llm)
                steps[0] = 0
                start = time.perf_counter()
                outputs = llm.generate(prompts, todo, use_tqdm=False)
                wall = time.perf_counter() - start
                after = _counters(llm)
                drafted = (
                    after["vllm:spec_decode_num_draft_tokens"] - before["vllm:spec_decode_num_draft_tokens"]
                )
                accepted = (
                    after["vllm:spec_decode_num_accepted_tokens"]
                    - before["vllm:spec_decode_num_accepted_tokens"]
                )
                tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
                calls = sum(_closed_calls(o.outputs[0].text) for o in outputs)
                runs.append(
                    {
                        "concurrency": n,
                        "tool_choice": choice_name,
                        "kind": kind,
                        "engine_steps": steps[0],
                        "calls_completed": calls,
                        "steps_per_call": round(steps[0] * n / calls, 2) if calls else None,
                        "steps_per_100_tokens": round(100 * steps[0] * n / tokens, 2),
                        "drafted": drafted,
                        "accepted": accepted,
                        "acceptance": round(accepted / drafted, 3) if drafted else 0.0,
                        "output_tokens": tokens,
                        "tokens_per_s": round(tokens / wall, 1),
                    }
                )
                print(json.dumps(runs[-1]), flush=True)
            runs.pop(-len(KINDS) - 1)  # the warm-up
            save({"num_speculative_tokens": drafts, "max_tokens": max_tokens, "runs": runs})
    return {"num_speculative_tokens": drafts, "max_tokens": max_tokens, "runs": runs}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["concurrency"], r["tool_choice"]) for r in report["runs"]})
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, field in zip(axes, ("steps_per_call", "acceptance", "tokens_per_s"), strict=True):
        width = 0.8 / len(KINDS)
        for k, kind in enumerate(KINDS):
            values = [
                next(
                    (r[field] or 0)
                    for r in report["runs"]
                    if (r["concurrency"], r["tool_choice"]) == g and r["kind"] == kind
                )
                for g in groups
            ]
            ax.bar([i + k * width for i in range(len(groups))], values, width, label=kind)
        ax.set_xticks([i + width for i in range(len(groups))], [f"{c} {t}" for c, t in groups])
        ax.set_title(field)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=7)
    fig.suptitle(
        f"grammar drafts, ngram ({report['num_speculative_tokens']}), whitespace {report['whitespace']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--drafts", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--whitespace", type=int, default=None, help="HERMES_VLLM_MAX_CALL_WHITESPACE")
    parser.add_argument("--model", choices=("random", "trained"), default="random")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.whitespace is not None:
        os.environ["HERMES_VLLM_MAX_CALL_WHITESPACE"] = str(args.whitespace)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"grammar-drafts-ws{1 if args.whitespace is None else args.whitespace}"
    stem += "-trained" if args.model == "trained" else ""

    def save(report: dict[str, Any]) -> None:
        """Written after each group of runs: a long run cut short keeps what it measured."""
        report["whitespace"] = "default (1)" if args.whitespace is None else args.whitespace
        report["model"] = args.model
        report["command"] = "python benchmarks/grammar_drafts.py " + " ".join(sys.argv[1:])
        (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        plot(report, args.out / f"{stem}.png")

    save(measure(tuple(args.concurrency), args.max_tokens, args.drafts, args.model, save))


if __name__ == "__main__":
    main()
