"""Per-step cost of the Model Runner V2 adapter as finished requests pile up in its slots.

V2 tells a processor nothing when a request finishes: its slot keeps our state until a new
request reuses it. This measures one step (``apply_staged_writes`` + ``apply``) of 16 live
constrained rows in free text while 0 ... 240 of the 256 slots hold finished constrained
requests, on vLLM's own request-state buffers on the CPU (``hermes_vllm.testing.v2_runner``).
Run it on two checkouts with ``--label`` to compare them; each label's figures are kept in the
same JSON, and the PNG plots every label.

Usage: python benchmarks/v2_slots.py [--label after] [--steps 200] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from plot import line_chart
from transformers import AutoTokenizer
from vllm import SamplingParams

from hermes_vllm import constraint_args
from hermes_vllm.processor import ToolCallLogitsProcessor
from hermes_vllm.testing import tiny_model_path
from hermes_vllm.testing.engine import engine_config
from hermes_vllm.testing.v2_runner import V2Runner, context

SLOTS = 256
LIVE = 16
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def step_us(finished: int, steps: int, model: Path) -> float:
    """Median microseconds of one step with ``finished`` finished slots beside the live ones."""
    config = engine_config(model)
    width = config.model_config.get_vocab_size()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    prompt = tokenizer.encode(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    text = tokenizer.encode(" plain words" * 200, add_special_tokens=False)
    runner = V2Runner(SLOTS, 1024, width)
    proc = ToolCallLogitsProcessor(config, runner.state)
    params = SamplingParams(max_tokens=512, extra_args=constraint_args([TOOL], "auto"))
    live = list(range(LIVE))
    for slot in range(LIVE + finished):
        runner.admit(slot, prompt)
        proc.add_request(slot, params)
    # One step with every slot in the batch, then the finished ones leave it for good.
    proc.apply_staged_writes()
    proc.apply(torch.zeros(LIVE + finished, width), context(range(LIVE + finished)))
    logits = torch.zeros(LIVE, width)
    samples = []
    for i in range(steps):
        for slot in live:
            runner.commit(slot, text[i % len(text)])
        start = time.perf_counter()
        proc.apply_staged_writes()
        proc.apply(logits, context(live))
        samples.append((time.perf_counter() - start) * 1e6)
    return statistics.median(samples[steps // 10 :])


def plot(results: dict[str, dict[str, float]], path: Path) -> None:
    line_chart(
        results,
        path,
        xlabel=f"finished constrained requests still in slots (of {SLOTS})",
        ylabel=f"us per step, {LIVE} live rows (median)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--tokenizer", default="tekken")
    parser.add_argument("--finished", type=int, nargs="+", default=[0, 64, 128, 240])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model = tiny_model_path(args.tokenizer)
    figures = {str(f): round(step_us(f, args.steps, model), 1) for f in args.finished}
    print(json.dumps({args.label: figures}))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "v2_slots.json"
    results = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    results[args.label] = figures
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    plot(results, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
