"""Per-step cost of the logits processor (V1 adapter, real vLLM batch objects), by batch size and span share.

Each row commits one token per step: rows "in a span" sit inside a tool call's string argument
(the expensive case: the grammar masks), the others write free text (the mask allows everything
and the row must be left alone). The figure reported is microseconds per row per step, with the
cost of rewriting the batch's logits once (``copy_``) measured alongside as the yardstick. Each
case runs twice: rows without ``max_tokens`` (no token budget) and rows with a ``max_tokens`` far
away (the budget follows every token it must read: the cost of the budget machinery itself).

With ``--e2e``, it also serves the tiny model three ways at once and measures output tokens/s at N
concurrent tool-call requests (default 16), the servers taking turns: our processor off (vLLM's
``hermes`` parser, no constraint), on (``hermes_vllm``), and vLLM's own structural-tag constraint
(``--tool-call-parser hermes --tool-strict-level parameter``), each figure a ratio to "off".

``--e2e-choice required``: the same with ``tool_choice="required"`` (no bias); with ``--trained``,
the demo's trained model asked held-out BFCL questions with their own tools.

``--required-offline``: the offline engine, ``--concurrency`` (16) ``required`` requests of 128
tokens, ours against vLLM's structural tag and against no constraint at all, ``--passes`` passes
in rotating order; with the time each pass spent in the sampler and in each constraint.

Usage: python benchmarks/processor.py [--tokenizer mistral-v1|tekken|qwen3|qwen2.5|llama3.1] [--steps 30]
    [--e2e [--passes 6]] [--first-token] [--required-offline] [--out DIR]

On ``qwen3`` / ``qwen2.5`` the constraint and the servers use the ``qwen`` dialect
(``hermes_vllm_qwen``; vLLM's own Qwen setup is its ``hermes`` parser), over 151,936-wide logits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from hermes_vllm.testing.tiny_model import DIALECT_OF, TOKENIZER_NAMES

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]
IN_SPAN_PREFIX = '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa'
FREE_PREFIX = "Sure, let me think about that"


def measure(
    tokenizer_name: str, batch_sizes: list[int], shares: list[float], steps: int
) -> list[dict[str, Any]]:
    import torch
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.sample.logits_processor import BatchUpdate

    from hermes_vllm import constraint_args, metrics
    from hermes_vllm.processor.v1 import V1ToolCallLogitsProcessor
    from hermes_vllm.testing import tiny_model_path

    model = tiny_model_path(tokenizer_name)  # type: ignore[arg-type]
    tok = AutoTokenizer.from_pretrained(str(model))
    config = EngineArgs(
        model=str(model), dtype="float32", enforce_eager=True, max_model_len=4096
    ).create_engine_config()
    width = config.model_config.get_vocab_size()
    span_prefix = tok.encode(IN_SPAN_PREFIX, add_special_tokens=False)
    free_prefix = tok.encode(FREE_PREFIX, add_special_tokens=False)
    in_string = tok.encode("x", add_special_tokens=False)[-1]
    free_word = tok.encode(" word", add_special_tokens=False)[-1]
    args = constraint_args(TOOLS, dialect=DIALECT_OF.get(tokenizer_name, "hermes"))
    metrics.install()  # our series recorded as on a server (what the plugin does)
    results = []
    cases = [(b, s, budget) for b in batch_sizes for s in shares for budget in (False, True)]
    for batch, share, budget in cases:
        proc = V1ToolCallLogitsProcessor(config, torch.device("cpu"), False)
        n_span = round(batch * share)
        outputs = [list(span_prefix if i < n_span else free_prefix) for i in range(batch)]
        params = SamplingParams(max_tokens=1 << 20 if budget else None, extra_args=args)
        added = [(i, params, None, outputs[i]) for i in range(batch)]
        proc.update_state(BatchUpdate(batch, [], added, []))
        logits = torch.randn(batch, width)
        proc.apply(logits)  # first step: compiles (cached afterwards) and replays the prefixes
        fresh = logits.clone()
        samples, baseline, uncounted = [], [], []
        for step in range(2 * steps):  # steps alternate: our series recorded, then not
            for i, out in enumerate(outputs):
                out.append(in_string if i < n_span else free_word)
            start = time.perf_counter()
            logits.copy_(fresh)
            baseline.append(time.perf_counter() - start)
            with contextlib.nullcontext() if step % 2 == 0 else metrics.paused():
                start = time.perf_counter()
                proc.apply(logits)
                (samples if step % 2 == 0 else uncounted).append(time.perf_counter() - start)
        step_us = statistics.median(samples) * 1e6
        step_uncounted_us = statistics.median(uncounted) * 1e6
        results.append(
            {
                "tokenizer": tokenizer_name,
                "vocab": width,
                "batch": batch,
                "span_share": share,
                "budget": budget,
                "step_us_p50": round(step_us, 1),
                "step_us_p50_not_counted": round(step_uncounted_us, 1),
                "counting_ratio": round(step_us / step_uncounted_us, 3),
                "us_per_row": round(step_us / batch, 2),
                "rewrite_logits_us_p50": round(statistics.median(baseline) * 1e6, 1),
            }
        )
        print(json.dumps(results[-1]), flush=True)
    return results


E2E_SERVERS: dict[str, tuple[str, ...]] = {
    "off": ("--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
    "hermes_vllm": ("--enable-auto-tool-choice", "--tool-call-parser", "hermes_vllm"),
    "vllm_strict": (
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--tool-strict-level",
        "parameter",
    ),
}


def e2e_servers(tokenizer_name: str) -> dict[str, tuple[str, ...]]:
    """:data:`E2E_SERVERS` with our parser for the tokenizer's dialect."""
    ours = {"qwen": "hermes_vllm_qwen"}.get(DIALECT_OF.get(tokenizer_name, "hermes"), "hermes_vllm")
    return {n: tuple(ours if a == "hermes_vllm" else a for a in flags) for n, flags in E2E_SERVERS.items()}


def end_to_end(
    tokenizer_name: str,
    concurrency: int,
    rounds: int,
    max_tokens: int,
    passes: int,
    choice: str = "auto",
    trained: bool = False,
) -> list[dict[str, Any]]:
    """Output tokens/s of ``concurrency`` simultaneous tool requests, per server configuration.

    ``choice`` is every request's ``tool_choice``; under ``auto`` the random model is biased
    toward the call (else it rarely opens one), under ``required`` nothing is (both constraints
    force the call). ``trained``: the demo's trained model, asked the held-out BFCL questions
    with their own tools (a tool set a request, so grammars are compiled as they come), no bias.

    The three servers stay up together (idle ones cost nothing) and take turns: ``passes`` bursts
    each, in rotating order, so the shared machine's drift hits every configuration alike. Each
    figure is a ratio to "off" (the median of the per-pass ratios, with their range), per wall
    second and per CPU second of the server and its engine core (the steadier figure on a shared
    machine). Each is also given as a ratio to vLLM's own constraint, pass by pass, and per call
    made (``_calls``: the replies' parsed tool calls) as well as per output token: where the
    servers write replies of different lengths (the trained model), a token is not the same work
    on both, and a ``required`` request's unit is its call. ``passes`` keeps every (tokens, wall
    seconds, CPU seconds, calls).
    """
    import asyncio
    from contextlib import ExitStack

    from openai import AsyncOpenAI
    from support.readings import server_usage
    from transformers import AutoTokenizer

    from hermes_vllm.demo import TOOLS, trained_model
    from hermes_vllm.demo.bias import call_bias
    from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
    from hermes_vllm.testing import tiny_model_path

    if trained:
        model = str(trained_model.trained_model_path())
        asked: list[tuple[Any, Any]] = [(i.messages, i.tools) for i in trained_model.held_out_items()]
        extra: dict[str, Any] = {}
    else:
        model = str(tiny_model_path(tokenizer_name))  # type: ignore[arg-type]
        asked = [([{"role": "user", "content": "Weather in Paris?"}], [TOOLS[0]])]  # get_weather
        bias = {str(k): v for k, v in call_bias(AutoTokenizer.from_pretrained(model)).items()}
        extra = {"ignore_eos": True, **({"logit_bias": bias} if choice == "auto" else {})}

    tool_choice: Any = choice

    async def burst(url: str, requests: int, seed0: int) -> tuple[int, float, float, int]:
        slots = asyncio.Semaphore(concurrency)
        # Closed inside the burst's loop (asyncio.run closes it; a client left to the collector
        # would close its connections on a closed loop).
        async with AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600) as client:

            async def one(seed: int) -> tuple[int, int]:
                messages, tools = asked[seed % len(asked)]
                async with slots:
                    reply = await client.chat.completions.create(
                        model=model,
                        messages=messages,
                        tools=tools,
                        tool_choice=tool_choice,
                        max_tokens=max_tokens,
                        temperature=0.0 if trained else 1.0,
                        seed=seed,
                        extra_body=extra,
                    )
                tokens = reply.usage.completion_tokens if reply.usage else 0
                return tokens, len(reply.choices[0].message.tool_calls or ())

            cpu, start = server_usage(url).cpu_seconds, time.perf_counter()
            counts = await asyncio.gather(*(one(seed0 + i) for i in range(requests)))
            wall = time.perf_counter() - start
        tokens, calls = (sum(column) for column in zip(*counts, strict=True))
        return tokens, wall, server_usage(url).cpu_seconds - cpu, calls

    servers = e2e_servers("qwen3" if trained else tokenizer_name)
    names = list(servers)
    samples: dict[str, list[tuple[int, float, float, int]]] = {name: [] for name in names}
    with ExitStack() as stack:
        urls = {
            n: stack.enter_context(openai_server(model, (*servers[n], *CPU_ARGS), CPU_ENV)) for n in names
        }
        for name in names:  # warm-up: compiles, caches
            asyncio.run(burst(urls[name], concurrency, 0))
        for k in range(passes):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                samples[name].append(asyncio.run(burst(urls[name], concurrency * rounds, 1000 * k)))
            rates = {n: [round(samples[n][-1][0] / x, 1) for x in samples[n][-1][1:3]] for n in names}
            print(json.dumps({"pass": k, "tok_per_wall_s, tok_per_cpu_s": rates}), flush=True)
    results = []
    for name in names:
        row: dict[str, Any] = {
            "server": name,
            "tokens": sum(sample[0] for sample in samples[name]),
            "calls": sum(sample[3] for sample in samples[name]),
        }
        for i, unit in ((1, "wall"), (2, "cpu")):
            seconds = sum(sample[i] for sample in samples[name])
            row |= {f"{unit}_s": round(seconds, 2), f"tok_per_{unit}_s": round(row["tokens"] / seconds, 1)}
            # Per output token, and per call made (a `required` workload's unit: where the servers
            # write replies of different lengths, a token is not the same work on both).
            for peer in ("off", "vllm_strict"):
                for count, suffix in ((0, ""), (3, "_calls")):
                    pairs = zip(samples[name], samples[peer], strict=True)
                    ratios = [
                        (mine[count] / mine[i]) / (other[count] / other[i])
                        for mine, other in pairs
                        if other[count]
                    ]
                    if ratios:
                        row |= {
                            f"x_{peer}_{unit}{suffix}": round(statistics.median(ratios), 3),
                            f"x_{peer}_{unit}{suffix}_range": [round(min(ratios), 3), round(max(ratios), 3)],
                        }
        row["passes"] = [list(sample) for sample in samples[name]]
        results.append(row)
    print(json.dumps(results), flush=True)
    return results


def first_token(tokenizer_name: str, samples: int) -> dict[str, Any]:
    """What a request sees when its call opens before its grammar is compiled.

    ``required`` requests open their call at the first token, so they wait for the compile:
    one-token requests with a new tool set each time (cold) against the same tool set (cached).
    """
    from support.corpus import bfcl_files, load_bfcl
    from support.offline import offline_llm
    from vllm import SamplingParams

    from hermes_vllm import constraint_args
    from hermes_vllm.testing import tiny_model_path

    llm = offline_llm(tiny_model_path(tokenizer_name))  # type: ignore[arg-type]
    sets = [case.tools for path in bfcl_files() if "multiple" in path.name for case in load_bfcl(path)]

    def once(tools: list[dict[str, Any]]) -> float:
        params = SamplingParams(max_tokens=1, extra_args=constraint_args(tools, "required"))
        start = time.perf_counter()
        llm.generate(["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"], params, use_tqdm=False)
        return (time.perf_counter() - start) * 1e3

    once(sets[0])
    cold = [once(sets[1 + i]) for i in range(samples)]
    cached = [once(sets[1]) for _ in range(samples)]
    plain = []
    for _ in range(samples):
        start = time.perf_counter()
        llm.generate(["hi"], SamplingParams(max_tokens=1), use_tqdm=False)
        plain.append((time.perf_counter() - start) * 1e3)
    result = {
        "tokenizer": tokenizer_name,
        "first_token_ms_p50": {
            "new_tool_set": round(statistics.median(cold), 1),
            "cached_tool_set": round(statistics.median(cached), 1),
            "no_tools": round(statistics.median(plain), 1),
        },
    }
    print(json.dumps(result), flush=True)
    return result


def trained_cases(requests: int, max_tokens: int) -> tuple[str, list[tuple[str, list[dict[str, Any]]]]]:
    """The trained model (:mod:`hermes_vllm.demo.trained_model`) and ``requests`` held-out BFCL
    items as (prompt, tools): prompts its training put tools in, so its replies are call attempts
    (names, arguments), not the random model's whitespace."""
    from transformers import AutoTokenizer

    from hermes_vllm.demo.trained_model import held_out_items, trained_model_path

    model = str(trained_model_path())
    tokenizer = AutoTokenizer.from_pretrained(model)
    cases = []
    for item in held_out_items():
        prompt = tokenizer.apply_chat_template(
            item.messages, tools=item.tools, add_generation_prompt=True, tokenize=False
        )
        if len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) + max_tokens <= OFFLINE_CONTEXT:
            cases.append((prompt, item.tools))
        if len(cases) == requests:
            break
    return model, cases


OFFLINE_CONTEXT = 2048
"""``offline_llm``'s ``max_model_len``."""


def required_offline(
    tokenizer_name: str, requests: int, max_tokens: int, passes: int, trained: bool = False
) -> dict[str, Any]:
    """Offline, ``tool_choice="required"``: output tokens/s of ours against vLLM's structural tag
    (what ``--tool-call-parser hermes --tool-strict-level parameter`` sends), alternating passes.

    Wall time mixes the constraint's cost with the sampler's, and vLLM's CPU sampler skips banned
    tokens (16 rows x 131k logits: 16 ms with all allowed, 3 ms with 1% allowed), so whichever
    constraint leaves the model fewer tokens samples faster: vLLM's lets the random model write
    whitespace inside its call (never closing it). Each pass therefore also reports the time
    in the sampler and in each constraint's own machinery (ours: the logits processor; vLLM's:
    filling, applying and advancing its grammars), per output token, and the same requests
    without any constraint run alongside as a third yardstick. With ``trained``, the requests are
    held-out BFCL items on the trained model (Qwen 3's tokenizer), each with its own tools.
    """
    from support.offline import offline_llm
    from support.timers import Timers
    from vllm import SamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.structured_output.backend_xgrammar import XgrammarGrammar
    from vllm.v1.worker import gpu_model_runner

    from hermes_vllm import sampling_options
    from hermes_vllm.processor.v1 import V1ToolCallLogitsProcessor
    from hermes_vllm.testing import tiny_model_path

    timers = Timers()
    timers.wrap(TopKTopPSampler, "forward_cpu", "sampler")
    timers.wrap(V1ToolCallLogitsProcessor, "apply", "hermes_vllm")
    timers.wrap(StructuredOutputManager, "grammar_bitmask", "vllm_structural_tag")
    timers.wrap(XgrammarGrammar, "accept_tokens", "vllm_structural_tag")
    timers.wrap(gpu_model_runner, "apply_grammar_bitmask", "vllm_structural_tag")
    if trained:
        model, cases = trained_cases(requests, max_tokens)
        dialect = "hermes"
    else:
        model = str(tiny_model_path(tokenizer_name))  # type: ignore[arg-type]
        cases = [("<|im_start|>user\nPlease help.<|im_end|>\n<|im_start|>assistant\n", TOOLS)] * requests
        dialect = DIALECT_OF.get(tokenizer_name, "hermes")
    llm = offline_llm(model)

    def params(tools: list[dict[str, Any]]) -> dict[str, Any]:
        chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools)
        tag = get_model_structural_tag(
            "hermes", chat.tools, "required", False, strict_level=ToolStrictLevel.PARAMETER
        )
        assert tag is not None
        options = sampling_options(llm.get_tokenizer(), tools, "required", dialect=dialect)
        # Every kind detokenizes alike: with the tags kept where they are special tokens (Llama 3.1).
        common: dict[str, Any] = {
            "temperature": 1.0,
            "max_tokens": max_tokens,
            "skip_special_tokens": options.pop("skip_special_tokens", True),
        }
        tag_json = json.dumps(tag.model_dump())
        return {
            "hermes_vllm": SamplingParams(**common, **options),
            "vllm_structural_tag": SamplingParams(
                **common, structured_outputs=StructuredOutputsParams(structural_tag=tag_json)
            ),
            "unconstrained": SamplingParams(**common),
        }

    per_case = [params(tools) for _, tools in cases]
    prompts = [prompt for prompt, _ in cases]
    kinds = {name: [p[name] for p in per_case] for name in per_case[0]}
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    unsampled: dict[str, list[float]] = {k: [] for k in kinds}
    sampler_us: dict[str, list[float]] = {k: [] for k in kinds}
    constraint_us: dict[str, list[float]] = {k: [] for k in kinds}
    names = list(kinds)
    for n in range(passes + 1):
        for name in names[n % 3 :] + names[: n % 3]:  # each kind first in turn
            timers.take()
            start = time.perf_counter()
            outputs = llm.generate(prompts, kinds[name], use_tqdm=False)
            wall = time.perf_counter() - start
            spent = timers.take()
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            if n:  # the first pass warms both up
                rates[name].append(tokens / wall)
                unsampled[name].append(tokens / (wall - spent.get("sampler", 0.0)))
                sampler_us[name].append(1e6 * spent.get("sampler", 0.0) / tokens)
                constraint_us[name].append(1e6 * spent.get(name, 0.0) / tokens)

    def ratios(of: dict[str, list[float]], to: str = "vllm_structural_tag") -> list[float]:
        return [a / b for a, b in zip(of["hermes_vllm"], of[to], strict=True)]

    def rounded(of: dict[str, list[float]]) -> dict[str, list[float]]:
        return {k: [round(r, 1) for r in v] for k, v in of.items()}

    def medians(of: dict[str, list[float]]) -> dict[str, float]:
        return {k: round(statistics.median(v), 1) for k, v in of.items()}

    return {
        "model": "trained" if trained else f"tiny ({tokenizer_name})",
        "requests": len(cases),
        "max_tokens": max_tokens,
        "tokens_per_s": rounded(rates),
        "ratio_per_pass": [round(r, 3) for r in ratios(rates)],
        "ratio_median": round(statistics.median(ratios(rates)), 3),
        "ratio_to_unconstrained_median": round(statistics.median(ratios(rates, "unconstrained")), 3),
        "vllm_to_unconstrained_median": round(
            statistics.median(
                a / b for a, b in zip(rates["vllm_structural_tag"], rates["unconstrained"], strict=True)
            ),
            3,
        ),
        "tokens_per_s_outside_the_sampler": rounded(unsampled),
        "outside_sampler_ratio_median": round(statistics.median(ratios(unsampled)), 3),
        "outside_sampler_ratio_to_unconstrained_median": round(
            statistics.median(ratios(unsampled, "unconstrained")), 3
        ),
        "sampler_us_per_token": rounded(sampler_us),
        "sampler_us_per_token_median": medians(sampler_us),
        "constraint_us_per_token": rounded(constraint_us),
        "constraint_us_per_token_median": medians(constraint_us),
    }


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for share, budget in sorted({(r["span_share"], r["budget"]) for r in results}):
        rows = [r for r in results if r["span_share"] == share and r["budget"] == budget]
        ax.plot(
            [r["batch"] for r in rows],
            [r["us_per_row"] for r in rows],
            marker="o",
            label=f"{share:.0%} rows in a call" + (", budget" if budget else ""),
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("processor us / row / step")
    ax.set_title(f"hermes-vllm processor cost ({results[0]['tokenizer']}, vocab {results[0]['vocab']})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default="tekken", choices=TOKENIZER_NAMES)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--share", type=float, nargs="+", default=[0.0, 0.25, 1.0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--e2e", action="store_true", help="also measure served tokens/s (three servers)")
    parser.add_argument("--first-token", action="store_true", help="also measure the compile wait")
    parser.add_argument(
        "--required-offline", action="store_true", help="also: required mode against vLLM's structural tag"
    )
    parser.add_argument(
        "--trained",
        action="store_true",
        help="--required-offline on the trained model and held-out BFCL items (Qwen 3's tokenizer)",
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="requests per burst / concurrency")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--offline-max-tokens", type=int, default=128, help="max_tokens of --required-offline's requests"
    )
    parser.add_argument("--passes", type=int, default=6, help="bursts per server in --e2e")
    parser.add_argument(
        "--e2e-choice", choices=("auto", "required"), default="auto", help="tool_choice of --e2e's requests"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    results = measure(args.tokenizer, args.batch, args.share, args.steps)
    args.out.mkdir(parents=True, exist_ok=True)
    # Not Path.with_suffix: "llama3.1" holds a dot.
    stem = f"processor-{args.tokenizer}" + ("-trained" if args.trained else "")
    stem += "-e2e-required" if args.e2e and args.e2e_choice == "required" else ""
    report: dict[str, Any] = {"per_step": results}
    if args.first_token:
        report["first_token"] = first_token(args.tokenizer, 15)
    if args.required_offline:
        report["required_offline"] = required_offline(
            args.tokenizer, args.concurrency, args.offline_max_tokens, args.passes, trained=args.trained
        )
        print(json.dumps(report["required_offline"]), flush=True)
    if args.e2e:
        report["end_to_end"] = end_to_end(
            args.tokenizer,
            args.concurrency,
            args.rounds,
            args.max_tokens,
            args.passes,
            args.e2e_choice,
            args.trained,
        )
        report["end_to_end_choice"] = args.e2e_choice
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot(results, args.out / f"{stem}.png")


if __name__ == "__main__":
    main()
