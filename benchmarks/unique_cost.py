"""What keeping ``uniqueItems`` costs the mask: the engine's fill, and the fill with the guard.

    python benchmarks/unique_cost.py [--tokenizer tekken] [--repeat 200] [--out PATH.json]

A ``required`` row of :class:`~support.generated_schemas.TagPost` (``set[str]``,
``frozenset[int]``) is fed up to a point, then its mask is filled ``--repeat`` times by the engine
alone and by the request's matcher (the engine, then :class:`~hermes_vllm.grammar.unique.UniqueGuard`
clearing the tokens that would close a repeated item). Medians in microseconds, by point.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from support.generated_schemas import TagPost
from transformers import AutoTokenizer

from hermes_vllm import constraint_args
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.testing import tiny_model_path

RESULTS = Path(__file__).parent / "results"
TOOL = {"type": "function", "function": {"name": "tag", "parameters": TagPost.model_json_schema()}}
HEAD = '<tool_call>{"name": "tag", "arguments": {"tags": ['
POINTS = {
    "inside a string item": HEAD + '"alpha", "be',
    "between items": HEAD + '"alpha", "beta"',
    "inside an integer item": HEAD + '"a", "b"], "ids": [12, 1',
    "outside the sets": HEAD + '"a", "b"], "stars": ',
}


def measure(core: ConstraintCore, tokenizer: Any, text: str, repeat: int) -> dict[str, float]:
    state = core.admit(constraint_args([TOOL], "required"), [], max_tokens=4000)
    assert state is not None
    core.step(torch.zeros((1, core.vocab_size)), [(0, state, [])])
    for token in tokenizer.encode(text, add_special_tokens=False):
        core.step(torch.zeros((1, core.vocab_size)), [(0, state, [token])])
    matcher = state.engine.matcher
    assert matcher is not None and state.failed is None
    engine, guarded = [], []
    for _ in range(repeat):
        began = time.perf_counter()
        matcher.engine_matcher.fill_bitmask(core.bitmask, 0)
        middle = time.perf_counter()
        matcher.fill_bitmask(core.bitmask, 0)
        guarded.append(time.perf_counter() - middle)
        engine.append(middle - began)
    return {"engine_us": statistics.median(engine) * 1e6, "with_guard_us": statistics.median(guarded) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokenizer", default="tekken")
    parser.add_argument("--engine", default="xgrammar")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS / "unique_cost.json")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path(args.tokenizer)))
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine=args.engine)
    points = {name: measure(core, tokenizer, text, args.repeat) for name, text in POINTS.items()}
    for name, figures in points.items():
        print(
            f"{name}: engine {figures['engine_us']:.0f} us, with the guard {figures['with_guard_us']:.0f} us"
        )
    meta = {
        "tokenizer": args.tokenizer,
        "vocab": len(tokenizer),
        "engine": args.engine,
        "repeat": args.repeat,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "points": points}, indent=1) + "\n")


if __name__ == "__main__":
    main()
