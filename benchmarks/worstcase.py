"""The budgets' "always" against a worst-case model, over schema shapes, engines and budgets.

    python benchmarks/worstcase.py [--sets 4] [--stride 8] [--rotate] [--jobs 2]
                                   [--engines xgrammar llguidance outlines] [--shapes N]
                                   [--samplers ...] [--tokenizer mistral-v1] [--out PATH.json]
                                   [--write-every N] [--resume] [--replies]
                                   [--generated [--models NAME ...]]
                                   [--runner core|v2-0.33|v2-0.34]

Every sampler of :mod:`hermes_vllm.testing.adversary` plays ``required``, named and ``auto`` turns
over hand-written schemas of each shape the completer covers and ``--sets`` BFCL tool sets, at
every ``--stride``-th ``max_tokens`` from the turn's reserve to reserve + 64 (``--rotate``: each
``max_tokens`` by one sampler, in turn), each run with one of:
nothing else, ``stop=["\\n\\n"]``, a thinking budget of 6 with vLLM's own thinking budget played.
With ``--generated`` the shapes are the tools clients generate instead
(:mod:`support.generated_schemas`: pydantic models, their ``allOf`` form, the openai
SDK's strict form, LangChain's and MCP servers' tools), each alone, and all of them four times
over under other names (a 132-tool set that the composed matcher serves on xgrammar); a run is
kept only if the client's own validation (``Model.model_validate``, an MCP server's
``validate_arguments``) and jsonschema with format checking accept every call.
``--runner`` plays every reply through the processor core (the default) or through the Model Runner
V2 adapter with its hooks called in 0.33's or 0.34's order (``hermes_vllm.testing.v2_runner``).
Writes PATH.json (every outcome, the summary by shape and by budget, the core's cost per row per
step inside and outside the steering window) and PATH.png (kept rate by shape and by budget).
``--replies`` writes every reply's text, token count and what ended it, kept or not, so that two
sweeps' replies can be compared (a structural change should leave them identical).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from support.corpus import sample_tool_sets
from support.generated_schemas import GeneratedTool, generated_tools
from transformers import AutoTokenizer

from hermes_vllm import constraint_args
from hermes_vllm.dialect import get_dialect
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.spans import split_spans
from hermes_vllm.testing import tiny_model_path
from hermes_vllm.testing.adversary import SAMPLERS, Scenario, V2Driver, run
from hermes_vllm.testing.engine import engine_config

RESULTS = Path(__file__).parent / "results"
THINKING = 6


def _object(properties: dict[str, Any], required: list[str] | None = None, **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or [], **more}


SHAPES: dict[str, list[dict[str, Any]]] = {
    "long optional key": [
        {
            "name": "get_weather",
            "parameters": _object(
                {
                    "city": {"type": "string"},
                    "include_historical_weather_data_for_comparison": {"type": "boolean"},
                },
                ["city"],
            ),
        }
    ],
    "small and large tool": [
        {"name": "t", "parameters": _object({})},
        {
            "name": "create_calendar_event_with_many_fields",
            "parameters": _object(
                {
                    k: {"type": "string", "minLength": 3}
                    for k in ("title", "location", "description", "organizer")
                },
                ["title", "location", "description", "organizer"],
            ),
        },
    ],
    "free-form object": [
        {
            "name": "put",
            "parameters": _object(
                {"meta": {"type": "object", "additionalProperties": {"type": "string"}}}, ["meta"]
            ),
        }
    ],
    "fractional range": [
        {
            "name": "tune",
            "parameters": _object(
                {
                    "p": {"type": "number", "minimum": 0.1, "maximum": 0.9},
                    "q": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
                },
                ["p", "q"],
            ),
        }
    ],
    "number above minimum": [
        {"name": "bn", "parameters": _object({"n": {"type": "integer", "minimum": 1000}}, ["n"])}
    ],
    "minProperties": [
        {
            "name": "mp",
            "parameters": _object({k: {"type": "integer"} for k in "abc"}, minProperties=2),
        }
    ],
    "pattern": [
        {
            "name": "book",
            "parameters": _object({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}}, ["code"]),
        }
    ],
    "nested arrays and anyOf": [
        {
            "name": "plan",
            "parameters": _object(
                {
                    "steps": {
                        "type": "array",
                        "minItems": 1,
                        "items": _object(
                            {
                                "what": {"anyOf": [{"type": "string", "minLength": 4}, {"type": "integer"}]},
                                "tags": {"type": "array", "items": {"enum": ["urgent", "later"]}},
                            },
                            ["what"],
                        ),
                    }
                },
                ["steps"],
            ),
        }
    ],
}


def _reserve(core: ConstraintCore, tools: list[dict[str, Any]], choice: Any) -> int:
    named = choice if choice in ("required", "auto") else {"type": "function", "function": {"name": choice}}
    args = constraint_args([{"type": "function", "function": t} for t in tools], named)
    state = core.admit(args, [], max_tokens=4096)
    assert state is not None and state.budget is not None
    return state.budget.reserve


GENERATED = "generated "
"""Prefix of the ``--generated`` shapes' names."""


def _generated() -> dict[str, GeneratedTool]:
    """Every generated tool by name: the corpus and three renamed copies of it."""
    tools = [*generated_tools(), *generated_tools("_b"), *generated_tools("_c"), *generated_tools("_d")]
    return {g.name: g for g in tools}


def _shapes(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    if args.generated:
        agent = _generated()
        played = [g for g in generated_tools() if not args.models or g.model.__name__ in args.models]
        shapes = {f"{GENERATED}{g.id}": [g.tool["function"]] for g in played}
        if not args.models:
            shapes[f"{GENERATED}agent set ({len(agent)} tools)"] = [
                g.tool["function"] for g in agent.values()
            ]
        return shapes
    shapes = dict(list(SHAPES.items())[: args.shapes])
    for n, tools in enumerate(sample_tool_sets(args.sets, seed=args.seed)):
        shapes[f"BFCL set {n}"] = [t.get("function", t) for t in tools]
    return shapes


def _plays(args: argparse.Namespace) -> list[tuple[int, str, int]]:
    """``(offset, sampler, variant)`` of every run of one shape and mode.

    Without ``--rotate`` every sampler plays every ``--stride``-th offset (variants rotating);
    with it, each offset is played once, by the next sampler, and each sampler meets every
    variant: every ``max_tokens`` is covered at a fifth of the runs.
    """
    out = []
    samplers = args.samplers
    for offset in range(0, 65, args.stride):
        if args.rotate:
            k = offset // args.stride
            out.append((offset, samplers[k % len(samplers)], (k // len(samplers)) % 3))
        else:
            out += [(offset, sampler, (offset // args.stride + k) % 3) for k, sampler in enumerate(samplers)]
    return out


_worker: dict[str, Any] = {}


def _task(
    job: tuple[argparse.Namespace, str, str, list[dict[str, Any]]],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every run of one engine and shape (a worker process keeps its tokenizer and cores).

    Every run of a shape, mode and sampler draws from the same seed, whatever its ``max_tokens``:
    replies that differ only in ``max_tokens`` play the same tokens until the budget first tells
    them apart, so the sampler's lookups of the shared part are answered from memory.
    """
    args, engine, shape, tools = job
    if "tokenizer" not in _worker:
        logging.getLogger("hermes_vllm").setLevel(logging.CRITICAL)
        _worker["tokenizer"] = AutoTokenizer.from_pretrained(str(tiny_model_path(args.tokenizer)))
    tokenizer = _worker["tokenizer"]
    if engine not in _worker:
        _worker[engine] = ConstraintCore(lambda: tokenizer, len(tokenizer), engine=engine)
    core = _worker[engine]
    driver: Any = core
    if args.runner != "core":
        if (engine, args.runner) not in _worker:
            config = engine_config(tiny_model_path(args.tokenizer))
            _worker[engine, args.runner] = V2Driver(core, config, args.runner.removeprefix("v2-"))
        driver = _worker[engine, args.runner]
    rows: list[dict[str, Any]] = []
    refused: list[str] = []
    for mode in ("required", "named", "auto"):
        choice = tools[0]["name"] if mode == "named" else mode
        try:
            low = _reserve(core, tools, "required" if mode == "auto" else choice)
        except ValueError as err:  # the engine refuses the shape at admission (HTTP 400)
            refused.append(f"{engine} {shape} {mode}: {err}")
            continue
        for offset, sampler, variant in _plays(args):
            scenario = Scenario(
                tools,
                choice,
                low + offset,
                stop=("\n\n",) if variant == 1 else (),
                thinking_budget=THINKING if variant == 2 else None,
                vllm_thinking=variant == 2,
            )
            o = run(driver, tokenizer, scenario, sampler, seed=args.seed + args.samplers.index(sampler))
            client = _client_verdicts(o.text) if shape.startswith(GENERATED) else []
            rows.append(
                {
                    "engine": engine, "shape": shape, "mode": mode, "sampler": sampler,
                    "offset": offset, "max_tokens": low + offset,
                    "variant": ("plain", "stop", "thinking")[variant],
                    "kept": o.kept(scenario.thinking_budget) and not client, "calls": o.calls,
                    "cut": o.cut, "invalid": o.invalid, "client_rejected": client, "failed": o.failed,
                    "spans": o.spans,
                    "window_steps": o.window_steps, "window_s": o.window_seconds,
                    "other_steps": o.other_steps, "other_s": o.other_seconds,
                    "text": o.text if not o.kept(scenario.thinking_budget) or client else "",
                    **({"reply": o.text, "tokens": o.tokens, "ended_by": o.ended_by} if args.replies else {}),
                }
            )  # fmt: skip
    return rows, refused


def _client_verdicts(text: str) -> list[str]:
    """Why the client would reject each closed call of ``text``: its tool's own pydantic model
    and jsonschema with format checking (empty when both accept every call)."""
    tools = _worker.setdefault("generated", _generated())
    out = []
    for span in split_spans(text, get_dialect("hermes"), strict=True):
        if span.kind == "call" and span.closed:
            with contextlib.suppress(ValueError, KeyError):  # not JSON: the adversary's judge says so
                payload = json.loads(span.body)
                why = tools[payload["name"]].accepts(payload["arguments"])
                if why is not None:
                    out.append(why[:300])
    return out


_SAME = (
    "tokenizer",
    "engines",
    "sets",
    "stride",
    "samplers",
    "rotate",
    "shapes",
    "thinking_budget",
    "seed",
    "runner",
)


def _resumed(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str], float]:
    """The rows, refusals and seconds of ``--out``'s earlier sweep whose tasks are done and kept.

    A task (one engine and shape) is done when it has rows or refusals in the file (the file is
    written only between tasks); a task with any run not kept is dropped, so it is played again
    against today's code. The earlier sweep must have played the same plays (``_SAME``).
    """
    if not args.resume or not args.out.exists():
        return [], [], 0.0
    earlier = json.loads(args.out.read_text())
    meta = {
        **earlier["meta"],
        "seed": earlier["meta"].get("seed", 1),
        "runner": earlier["meta"].get("runner", "core"),
    }
    ours = {**vars(args), "thinking_budget": THINKING}
    differ = [k for k in _SAME if meta.get(k) != ours[k]]
    if differ:
        raise SystemExit(f"--resume: {args.out} was swept with other {', '.join(differ)}")
    lost = {(r["engine"], r["shape"]) for r in earlier["rows"] if not r["kept"]}
    rows = [r for r in earlier["rows"] if (r["engine"], r["shape"]) not in lost]
    refused = [
        n for n in earlier["refused_at_admission"] if not any(n.startswith(f"{e} {s} ") for e, s in lost)
    ]
    return rows, refused, float(earlier["meta"]["seconds"])


def _done(rows: list[dict[str, Any]], refused: list[str], engine: str, shape: str) -> bool:
    return any(r["engine"] == engine and r["shape"] == shape for r in rows) or any(
        n.startswith(f"{engine} {shape} ") for n in refused
    )


def sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Every engine and shape as one task, over ``--jobs`` processes; the results file is
    rewritten every ``--write-every`` tasks, so a long sweep leaves what it has measured, and
    ``--resume`` plays only the tasks it lacks (and those it holds a failure of)."""
    shapes = _shapes(args)
    rows, refused, before = _resumed(args)
    jobs = [
        (args, engine, shape, tools)
        for shape, tools in shapes.items()
        for engine in args.engines
        if not _done(rows, refused, engine, shape)
    ]
    logging.info("%d tasks to play", len(jobs))
    began = time.perf_counter() - before
    context = multiprocessing.get_context("fork")
    with context.Pool(args.jobs) as pool:
        for done, (more, no) in enumerate(pool.imap_unordered(_task, jobs), start=1):
            rows += more
            refused += no
            if done % args.write_every == 0 or done == len(jobs):
                kept = sum(r["kept"] for r in rows)
                logging.info("%d/%d tasks: %d/%d kept, %.0f s", done, len(jobs), kept, len(rows),
                             time.perf_counter() - began)  # fmt: skip
                _write(args, _summary(args, rows, refused, time.perf_counter() - began))
    return _summary(args, rows, refused, time.perf_counter() - began)


def _rate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    kept = sum(r["kept"] for r in rows)
    return {"kept": kept, "runs": len(rows), "rate": kept / len(rows) if rows else None}


def _summary(
    args: argparse.Namespace, rows: list[dict[str, Any]], refused: list[str], seconds: float
) -> dict[str, Any]:
    by: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for key in ("shape", "offset", "engine", "mode", "sampler", "variant"):
            by[key][str(r[key])].append(r)
    window = [r["window_s"] / r["window_steps"] for r in rows if r["window_steps"]]
    other = [r["other_s"] / r["other_steps"] for r in rows if r["other_steps"]]
    return {
        "meta": {
            "tokenizer": args.tokenizer, "engines": args.engines, "sets": args.sets, "stride": args.stride,
            "samplers": args.samplers, "rotate": args.rotate, "shapes": args.shapes, "jobs": args.jobs,
            "thinking_budget": THINKING, "seed": args.seed, "runner": args.runner,
            "seconds": round(seconds, 1), "command": " ".join(sys.argv),
        },
        "total": _rate(rows),
        "by": {key: {k: _rate(v) for k, v in groups.items()} for key, groups in by.items()},
        "step_us": {
            "window_median": 1e6 * statistics.median(window) if window else None,
            "outside_median": 1e6 * statistics.median(other) if other else None,
        },
        "refused_at_admission": refused,
        "failures": [r for r in rows if not r["kept"]],
        "rows": rows,
    }  # fmt: skip


def _chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    shapes = result["by"]["shape"]
    left.barh(list(shapes), [100 * v["rate"] for v in shapes.values()], color="#3a7")
    left.set_xlabel("% of runs kept (owed call complete and valid, spans within budget, no failed row)")
    left.set_xlim(0, 100)
    left.invert_yaxis()
    offsets = result["by"]["offset"]
    right.plot([int(k) for k in offsets], [100 * v["rate"] for v in offsets.values()], marker="o")
    right.set_xlabel("max_tokens - reserve")
    right.set_ylim(0, 101)
    total = result["total"]
    fig.suptitle(
        f"Worst-case samplers: {total['kept']}/{total['runs']} kept ({', '.join(result['meta']['engines'])})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)  # written after every task: an open figure each time piled up


def _write(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Written after each engine too, so a long sweep leaves what it has measured."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    _chart(result, args.out.with_suffix(".png"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=4, help="BFCL tool sets besides the hand-written shapes")
    parser.add_argument("--stride", type=int, default=8, help="step between the max_tokens tried")
    parser.add_argument("--engines", nargs="+", default=["xgrammar", "llguidance", "outlines"])
    parser.add_argument("--tokenizer", default="mistral-v1")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--shapes", type=int, default=len(SHAPES), help="hand-written shapes played (first N)"
    )
    parser.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=SAMPLERS)
    parser.add_argument(
        "--runner",
        default="core",
        choices=["core", "v2-0.33", "v2-0.34"],
        help="what the replies are played through",
    )
    parser.add_argument(
        "--rotate", action="store_true", help="one sampler per max_tokens, in turn (a fifth of the runs)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="worker processes (2 were slower on a shared 2-core machine)"
    )
    parser.add_argument("--write-every", type=int, default=4, help="tasks between writes of the results")
    parser.add_argument("--out", type=Path, default=RESULTS / "worstcase.json")
    parser.add_argument(
        "--replies",
        action="store_true",
        help="write every reply (text, tokens, what ended it), kept or not: to compare two sweeps' replies",
    )
    parser.add_argument(
        "--resume", action="store_true", help="keep --out's done tasks without failures; play the rest"
    )
    parser.add_argument(
        "--generated",
        action="store_true",
        help="the generated-schema corpus (pydantic, allOf, openai strict) instead of the shapes and sets,"
        " judged by each tool's pydantic model too",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        default=[],
        help="with --generated: only these models' tools, each alone (no agent set), e.g. Tally",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("hermes_vllm").setLevel(logging.CRITICAL)
    result = sweep(args)
    _write(args, result)
    total = result["total"]
    print(f"{total['kept']}/{total['runs']} kept; step us in window / outside: {result['step_us']}")
    return 0 if total["kept"] == total["runs"] else 1


if __name__ == "__main__":
    sys.exit(main())
