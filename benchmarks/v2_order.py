"""Per-step CPU cost of each way to serve constrained rows on Model Runner V2 (issues 26, 38).

vLLM 0.34 calls a V2 logits processor's ``apply_staged_writes()`` only on steps that admit
requests; the adapter's rows' tokens are copied before the forward on every step by the step hook
(a wrap of the runner's ``update_requests``, ``hermes_vllm/vllm_api/step_hook.py``), and without
it ``apply()`` gathers them itself. Four ways are timed on the same rows and tokens, on vLLM's own
request-state buffers on the CPU (``hermes_vllm.testing.v2_runner``), at each batch size:

- ``v2 (0.33 order)``: the hooks gather before the forward, ``apply()`` advances and masks;
- ``v2 (0.34 order)``: the same, the staged-writes hook only on the admitting step;
- ``v2 (0.34 order, no step hook)``: no hook between admissions, ``apply()`` gathers, advances
  and masks (what 0.34 did before the step hook);
- ``hosted``: vLLM's structured-output path, each row a ``HostedGrammar`` (what speculative
  decoding uses today): per step and row ``fill_bitmask`` into vLLM's bitmask, the bitmask applied
  to the logits by xgrammar's kernel, then ``accept_tokens`` of the sampled token.

Each row writes a sentence, then a call to one tool whose string argument keeps it inside the
call, then free text; rows start at staggered offsets so a batch mixes free text and calls. On a
GPU a gather in ``apply()`` differs by more than this CPU cost: the copy queued before the forward
has finished when ``apply()`` runs and the fill overlaps the forward; one made in ``apply()`` waits
for the forward first (``docs/architecture.md``, "Model Runner V2 across releases"). For each V2
kind the script prints ``apply() gathered after the forward on K of N steps``.

Usage: python benchmarks/v2_order.py [--batch 8 64 256] [--steps 40] [--tokenizer tekken] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xgrammar as xgr
from plot import line_chart
from support.budget_scenarios import WEATHER as TOOL
from transformers import AutoTokenizer
from vllm import SamplingParams

from hermes_vllm import constraint_args
from hermes_vllm.processor import ToolCallLogitsProcessor
from hermes_vllm.processor.config import new_core
from hermes_vllm.processor.hosted import RowHost
from hermes_vllm.testing import tiny_model_path
from hermes_vllm.testing.engine import engine_config
from hermes_vllm.testing.v2_runner import CALL_ORDERS, V2Runner, context, play_step

TURN = (
    "Let me look that up for you.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "'
    + "Llanfair pwllgwyngyll gogery chwyrn drobwll " * 3
    + '"}}\n</tool_call>\n'
    + "The answer follows shortly. " * 8
)
KINDS = ("v2 (0.33 order)", "v2 (0.34 order)", "v2 (0.34 order, no step hook)", "hosted")


def _plans(tokenizer: Any, batch: int, steps: int) -> list[list[int]]:
    """Each row's tokens: the turn from a staggered offset, long enough for ``steps``."""
    turn = tokenizer.encode(TURN, add_special_tokens=False)
    return [(turn * 2)[(i * 7) % len(turn) :][:steps] for i in range(batch)]


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, extra_args=constraint_args([TOOL], "auto"))


def time_v2(
    config: Any, plans: list[list[int]], release: str, late: list[int], step_hook: bool = True
) -> list[float]:
    """Microseconds of each step through the V2 adapter in ``release``'s call order; appends to
    ``late`` the steps and how many of them gathered in ``apply()``, after the forward."""
    width = config.model_config.get_vocab_size()
    batch = len(plans)
    runner = V2Runner(batch, 2048, width)
    proc = ToolCallLogitsProcessor(config, runner.state)
    for slot in range(batch):
        runner.admit(slot, [])
        assert proc.add_request(slot, _params(1024))
    order, ctx = CALL_ORDERS[release], context(range(batch))
    samples = []
    for step in range(len(plans[0])):
        logits = torch.zeros(batch, width)
        start = time.perf_counter()
        play_step(proc, order, step == 0, logits, ctx, step_hook)
        samples.append((time.perf_counter() - start) * 1e6)
        for slot, plan in enumerate(plans):
            runner.commit(slot, plan[step])
    late += [len(plans[0]), proc.late_gathers]
    return samples


def time_hosted(config: Any, plans: list[list[int]]) -> list[float]:
    """Microseconds of each step through hosted grammars, as vLLM's scheduler and runner use
    them without drafts (the bitmask filled row by row, applied, then the sampled tokens)."""
    width = config.model_config.get_vocab_size()
    host = RowHost(new_core(config, pin_memory=False), 1)
    grammars = [host.grammar(_params(1024)) for _ in plans]
    bitmask = xgr.allocate_token_bitmask(len(plans), width)
    samples = []
    for step in range(len(plans[0])):
        logits = torch.zeros(len(plans), width)
        start = time.perf_counter()
        for i, grammar in enumerate(grammars):
            grammar.fill_bitmask(bitmask, i)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        for grammar, plan in zip(grammars, plans, strict=True):
            assert grammar.accept_tokens("r", [plan[step]])
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def measure(
    model: Path, batches: list[int], steps: int, repeats: int, late: dict[str, list[int]]
) -> dict[str, dict[str, float]]:
    """Median microseconds per step of each kind at each batch size; the kinds alternate within
    each repeat, so the shared machine's load falls on all of them alike. ``late`` gets, per V2
    kind, the steps played and those whose ``apply()`` gathered after the forward."""
    config = engine_config(model)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    for kind in KINDS[:3]:
        late[kind] = [0, 0]

    def v2(kind: str, release: str, step_hook: bool) -> Callable[[list[list[int]]], list[float]]:
        def timed(plans: list[list[int]]) -> list[float]:
            counts: list[int] = []
            samples = time_v2(config, plans, release, counts, step_hook)
            late[kind] = [late[kind][0] + counts[0], late[kind][1] + counts[1]]
            return samples

        return timed

    runs: dict[str, Callable[[list[list[int]]], list[float]]] = {
        KINDS[0]: v2(KINDS[0], "0.33", True),
        KINDS[1]: v2(KINDS[1], "0.34", True),
        KINDS[2]: v2(KINDS[2], "0.34", False),
        KINDS[3]: lambda plans: time_hosted(config, plans),
    }
    figures: dict[str, dict[str, float]] = {kind: {} for kind in KINDS}
    for batch in batches:
        plans = _plans(tokenizer, batch, steps)
        samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(repeats):
            for kind, timed in runs.items():
                samples[kind].extend(timed(plans)[1:])  # the first step admits and compiles
        for kind in KINDS:
            figures[kind][str(batch)] = round(statistics.median(samples[kind]), 1)
    return figures


def plot(figures: dict[str, dict[str, float]], path: Path, title: str) -> None:
    in_ms = {kind: {b: us / 1000 for b, us in by_batch.items()} for kind, by_batch in figures.items()}
    line_chart(
        in_ms,
        path,
        xlabel="constrained rows in the batch",
        ylabel="ms per step, CPU (median)",
        title=title,
        log2_x=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokenizer", default="tekken")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    late: dict[str, list[int]] = {}
    figures = measure(tiny_model_path(args.tokenizer), args.batch, args.steps, args.repeats, late)
    base = figures[KINDS[0]]
    ratios = {
        kind: {b: round(v / base[b], 2) for b, v in by_batch.items()} for kind, by_batch in figures.items()
    }
    report = {
        "tokenizer": args.tokenizer,
        "steps": args.steps,
        "repeats": args.repeats,
        "us_per_step": figures,
        "ratio_to_0.33_order": ratios,
        "late_gathers": {kind: {"steps": n, "gathered_after_forward": k} for kind, (n, k) in late.items()},
    }
    print(json.dumps(report, indent=2))
    for kind, (n, k) in late.items():
        print(f"{kind}: apply() gathered after the forward on {k} of {n} steps")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"v2_order-{args.tokenizer}.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot(figures, path.with_suffix(".png"), f"{args.tokenizer}, {args.steps} steps x {args.repeats}")


if __name__ == "__main__":
    main()
