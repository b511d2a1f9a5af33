"""CPU per step at 256 rows: the V2 adapter against vLLM's own ``StructuredOutputManager.grammar_bitmask``.

The same rows, the same tokens, the same tool, in one process running vLLM 0.34's Python layer
(the overlay of ``tests/support/overlay.py``; the script starts itself under it):

- ``hermes_vllm``: the V2 adapter on the runner's own buffers (``hermes_vllm.testing.v2_runner``)
  in 0.34's call order with the step hook; per step the hooks and ``apply()`` (each row advanced by
  its token, the batch's bitmask filled), without writing the bitmask into the logits
  (``xgrammar.apply_token_bitmask_inplace`` is skipped): a GPU does that on the device, and done
  here it wrote 256 rows of 131-152k floats (134-155 MB) on the CPU, which evicted the caches
  every step for what followed it (timing the write and subtracting it left that in);
- ``vllm_structural_tag``: vLLM's structured outputs on xgrammar with the structural tag of
  ``--tool-call-parser hermes`` for the same tool (``auto``): per step the scheduler's
  ``grammar_bitmask`` for every row (the release's own code: at 256 rows its thread-pool fill), then
  ``accept_tokens`` of each row's token; the bitmask's trip to the GPU and its kernel are not timed.

Each row first writes its way to where it is timed (untimed): a call's string argument (the share
``--inside`` of the rows, from staggered offsets) or free text (the others). The two sides take
turns step by step (ours, then vLLM's), so that a shared machine's load falls on both alike; the
median microseconds per step, CPU (every thread of the process: the steady figure
on a shared machine) and wall, are reported, and the ratios ours / vLLM's.

Usage: python benchmarks/v2_bitmask.py [--rows 256] [--steps 24] [--repeats 3]
[--tokenizers qwen3 tekken] [--inside 0.25 1.0] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.budget_scenarios import WEATHER as TOOL

OVERLAY = "0.34.0"
CALL = 'Let me look that up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "'
ARGUMENT = "Llanfair pwllgwyngyll gogery chwyrn drobwll llantysilio gogo goch "
TEXT = "The answer follows shortly, with every detail you asked for. "
KINDS = ("hermes_vllm", "vllm_structural_tag")


def plans(tokenizer: Any, rows: int, inside: float, length: int) -> tuple[list[list[int]], int]:
    """Each row's tokens, and how many of them come before the timed steps: the call's opening and
    a staggered part of its argument for the rows inside, free text for the others."""
    call = tokenizer.encode(CALL, add_special_tokens=False)
    argument = tokenizer.encode(ARGUMENT * 64, add_special_tokens=False)
    text = tokenizer.encode(TEXT * 64, add_special_tokens=False)
    warm = len(call) + 8
    inside_rows = round(rows * inside)
    out = []
    for i in range(rows):
        if i * inside_rows // rows != (i + 1) * inside_rows // rows:  # spread evenly
            out.append([*call, *argument[i % 8 :]][: warm + length])
        else:
            out.append(text[i % 8 :][: warm + length])
    return out, warm


class Clock:
    """Wall and CPU seconds (every thread of the process: both sides fill on worker threads)
    spent inside ``with`` blocks since the last :meth:`reset`. On a shared machine the CPU
    seconds are the steady figure: other processes' load stretches the wall time only."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def reset(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> Clock:
        self._start = (time.perf_counter(), time.process_time())
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall += time.perf_counter() - self._start[0]
        self.cpu += time.process_time() - self._start[1]


def time_ours(config: Any, rows: list[list[int]], warm: int) -> Iterator[tuple[float, float] | None]:
    """Seconds (wall, CPU) of each step through the V2 adapter, without the logits write (None
    for the untimed steps); the first item is yielded once the rows are admitted."""
    import torch
    import xgrammar as xgr
    from vllm import SamplingParams

    from hermes_vllm import constraint_args
    from hermes_vllm.processor import ToolCallLogitsProcessor
    from hermes_vllm.testing.v2_runner import CALL_ORDERS, V2Runner, context, play_step

    width = config.model_config.get_vocab_size()
    runner = V2Runner(len(rows), 1024, width)
    proc = ToolCallLogitsProcessor(config, runner.state)
    for slot in range(len(rows)):
        runner.admit(slot, [])
        params = SamplingParams(max_tokens=512, extra_args=constraint_args([TOOL], "auto"))
        assert proc.add_request(slot, params)
    order, ctx = CALL_ORDERS[OVERLAY[:4]], context(range(len(rows)))
    logits = torch.zeros(len(rows), width)
    yield None
    write = xgr.apply_token_bitmask_inplace
    for step in range(len(rows[0])):
        xgr.apply_token_bitmask_inplace = lambda *args, **kwargs: None  # the GPU's part
        try:
            with Clock() as clock:
                play_step(proc, order, step == 0, logits, ctx)
        finally:
            xgr.apply_token_bitmask_inplace = write
        for slot, plan in enumerate(rows):
            runner.commit(slot, plan[step])
        yield (clock.wall, clock.cpu) if step >= warm else None
    assert proc.late_gathers == 0


def _structural_tag() -> str:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=[TOOL])
    tag = get_model_structural_tag(
        "hermes", chat.tools, "auto", False, strict_level=ToolStrictLevel.PARAMETER
    )
    assert tag is not None
    return json.dumps(tag.model_dump())


def time_vllm(config: Any, rows: list[list[int]], warm: int) -> Iterator[tuple[float, float] | None]:
    """Seconds (wall, CPU) of each step of vLLM's manager, the bitmask, then the tokens (None for
    the untimed steps); the first item is yielded once the grammars are compiled."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    manager = StructuredOutputManager(config)
    tag = _structural_tag()
    requests = {}
    for i in range(len(rows)):
        structured = StructuredOutputsParams(structural_tag=tag)
        structured._backend = "xgrammar"
        params = SamplingParams(max_tokens=512, structured_outputs=structured)
        request = Request(f"r{i}", [0], params, None)
        manager.grammar_init(request)
        requests[request.request_id] = request
    for request in requests.values():
        assert request.structured_output_request is not None
        while request.structured_output_request.grammar is None:
            time.sleep(0.001)
    ids = list(requests)
    yield None
    for step in range(len(rows[0])):
        with Clock() as clock:
            if step >= warm:
                manager.grammar_bitmask(requests, ids, {})
            for request, plan in zip(requests.values(), rows, strict=True):
                assert manager.accept_tokens(request, [plan[step]])
        yield (clock.wall, clock.cpu) if step >= warm else None


def interleaved(config: Any, rows: list[list[int]], warm: int) -> dict[str, list[tuple[float, float]]]:
    """Both sides' timed steps, played in turn (ours, then vLLM's, step by step), so that the load
    other processes put on a shared machine falls on both alike."""
    sides = dict(zip(KINDS, (time_ours(config, rows, warm), time_vllm(config, rows, warm)), strict=True))
    for side in sides.values():
        next(side)  # set up: rows admitted, grammars compiled
    samples: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    for pair in zip(*sides.values(), strict=True):
        for kind, sample in zip(sides, pair, strict=True):
            if sample is not None:
                samples[kind].append(sample)
    return samples


def measure(tokenizer_name: str, rows: int, shares: list[float], steps: int, repeats: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from hermes_vllm.testing import tiny_model_path
    from hermes_vllm.testing.engine import engine_config

    model = tiny_model_path(tokenizer_name)
    config = engine_config(model)
    config.scheduler_config.max_num_seqs = max(rows, config.scheduler_config.max_num_seqs)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    out: dict[str, Any] = {}
    for share in shares:
        planned, warm = plans(tokenizer, rows, share, steps)
        samples: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
        for _ in range(repeats):
            for kind, steps_ in interleaved(config, planned, warm).items():
                samples[kind] += steps_
        figures: dict[str, Any] = {}
        for i, measure_ in enumerate(("wall", "cpu")):
            medians = {
                kind: round(1e6 * statistics.median(s[i] for s in v), 1) for kind, v in samples.items()
            }
            figures[f"{measure_}_us_per_step"] = medians
            figures[f"{measure_}_ratio"] = round(medians["hermes_vllm"] / medians["vllm_structural_tag"], 3)
        out[f"{share:.0%} inside calls"] = figures
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    from plot import pyplot

    plt = pyplot()
    labels, ours, theirs = [], [], []
    for tokenizer, cases in report["results"].items():
        for case, figures in cases.items():
            labels.append(f"{tokenizer}\n{case}")
            ours.append(figures["cpu_us_per_step"]["hermes_vllm"] / 1000)
            theirs.append(figures["cpu_us_per_step"]["vllm_structural_tag"] / 1000)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], ours, 0.4, label="hermes_vllm (V2 adapter)")
    ax.bar([x + 0.2 for x in xs], theirs, 0.4, label="vLLM grammar_bitmask + accept_tokens")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("CPU ms per step (median)")
    ax.set_title(f"{report['rows']} rows, vLLM {report['vllm']}, no logits write")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokenizers", nargs="+", default=["qwen3", "tekken"])
    parser.add_argument("--inside", type=float, nargs="+", default=[0.25, 1.0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    from support.overlay import OVERLAY_ENV, overlay_env

    if os.environ.get(OVERLAY_ENV) != OVERLAY:  # vLLM's own code of the release, not the venv's
        sys.exit(
            subprocess.run([sys.executable, *sys.argv], env=overlay_env(OVERLAY), check=False).returncode
        )
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm

    results = {
        name: measure(name, args.rows, args.inside, args.steps, args.repeats) for name in args.tokenizers
    }
    report = {"vllm": vllm.__version__, "rows": args.rows, "steps": args.steps, "repeats": args.repeats}
    report["results"] = results
    print(json.dumps(report, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "v2_bitmask.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot(report, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
