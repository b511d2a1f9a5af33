"""Compile and mask-fill cost of each grammar engine over the BFCL tool sets, per tokenizer.

    python benchmarks/compile.py [--engines xgrammar,llguidance,outlines]
        [--tokenizers mistral-v1,tekken,qwen3,llama3.1] [--limit N] [--engine-limit outlines=20]
        [--peer] [--out benchmarks/results/compile.json]
    python benchmarks/compile.py --agent-scale [--sizes 1,8,32,139,400] [--repeats 3]
        [--tokenizers tekken] [--out benchmarks/results/compile-agents.json]

``--agent-scale``: 1 to 400 distinct tools per request against vLLM's structural tag on raw
xgrammar, the targets of issue 19 (:mod:`agent_scale`). Otherwise:

Tokenizers are the tiny models' (:data:`hermes_vllm.testing.tiny_model.TOKENIZER_NAMES`): 32k
Mistral v1, 131k tekken, Qwen 3 (151,669 tokens in 151,936-wide logits, ``qwen`` dialect), Llama
3.1 (128k, Hermes 3's tags as special tokens). The vocabulary is as wide as the model's logits.

Per engine and tokenizer, over the distinct tool sets of every ``BFCL_v4_*.json`` file (or an evenly
spread ``--limit`` of them), in lenient coverage so that every engine compiles what it can:

- cold compile: a cache miss through ``ToolGrammarCompiler`` (submit to the compile pool, wait);
- cached: the cache-hit path of ``ToolGrammarCompiler`` (key, lookup, future) for a prepared request,
  and, apart, ``prepare`` (normalise + coverage), which runs once per request at admission;
- hit: what the engine's admission does for a new request carrying a set it compiled before
  (the constraint's JSON text, a fresh string each time: decoded, prepared, keyed, found), from
  the second such request on (the memos of ``decode_constraint`` and ``prepare_constraint``, then
  the cache: an agent resending its tools); the first, which decodes and prepares the set (the
  frontend did in its own process), is ``first admission``;
- again: ``ToolGrammarCompiler.compile`` of a tool set it compiled before, the whole public path
  (prepare, memoised by the arguments' JSON, then the cache hit);
- mask fill: one ``fill_bitmask`` of the public matcher (``CompiledToolGrammar.matcher()``) before each
  token of ``text <tool_call>{ground truth}</tool_call> text``, split into positions inside the call
  span and outside it (free text, where the matcher copies the grammar's start mask);
- size: the compiled grammar's ``memory_bytes`` (llguidance: its grammar text, a lower bound;
  outlines: its serialised index);
- xgrammar's share of each cold compile (the default engine): the time inside xgrammar's
  ``GrammarCompiler.compile_grammar``; the rest is writing the EBNF and its passes, xgrammar's
  JSON-schema conversion and EBNF parse, and the compile pool's hand-off;
- with ``--peer`` (the default engine): the same set's cold compile on raw xgrammar as vLLM builds
  it (the structural tag of ``--tool-call-parser hermes --tool-strict-level parameter``, vLLM's
  backend settings, :class:`agent_scale.Vllm`), the two sides taking turns first: a spike raw
  xgrammar has too is the engine's, not ours.

The machine is shared and noisy, so each figure is also given as a ratio to the default engine
measured in the same run over the same tool sets. Writes PATH.json, PATH.md and PATH.png.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import agent_scale
import numpy as np
from support.corpus import BfclCase, bfcl_files, load_bfcl
from support.soundness import call_text, ground_truth_arguments

from hermes_vllm.constraint import ARGS_KEY, constraint_args, decode_constraint
from hermes_vllm.grammar import CompiledToolGrammar, GrammarCompileError, ToolGrammarCompiler, ToolSchemaError
from hermes_vllm.grammar.cache import GrammarCache
from hermes_vllm.grammar.compiler import prepare_constraint
from hermes_vllm.grammar.engines.base import EngineGrammar, allocate_bitmask
from hermes_vllm.grammar.engines.xgrammar import XGrammarEngine
from hermes_vllm.schema import canonical_json
from hermes_vllm.schema.tool import bfcl_to_json_schema
from hermes_vllm.testing import tiny_model_path
from hermes_vllm.testing.tiny_model import DIALECT_OF, TOKENIZER_NAMES

RESULTS = Path(__file__).parent / "results"
DEFAULT_ENGINE = "xgrammar"
DEFAULT_TOKENIZERS = "mistral-v1,tekken"
TARGETS: dict[str, dict[str, float]] = {  # issue 3: 2 cores, 131k vocabulary, default engine
    "cold_ms": {"p50": 15.0, "p99": 100.0},
    "cached_us": {"p50": 100.0},
    "hit_us": {"p99": 100.0},  # issue 38 item 5
    "again_us": {"p50": 100.0},
    "mask_in_us": {"p50": 5.0},
    "mask_out_us": {"p50": 2.0},
    "size_bytes": {"max": 10 * 1024 * 1024},
}
METRICS = (
    "cold_ms",
    "cached_us",
    "hit_us",
    "first_admission_us",
    "again_us",
    "prepare_ms",
    "mask_in_us",
    "mask_out_us",
    "size_bytes",
)
PREFIX, SUFFIX = "Let me look that up for you. ", " Done, anything else?"
CACHED_REPEATS = 20


@dataclass
class SetResult:
    """One tool set under one engine and tokenizer."""

    id: str
    tools: int
    status: str = "compiled"
    message: str = ""
    cold_ms: float = 0.0
    prepare_ms: float = 0.0
    size_bytes: int = 0
    cached_us: list[float] = field(default_factory=list)
    hit_us: list[float] = field(default_factory=list)
    first_admission_us: float = 0.0
    again_us: list[float] = field(default_factory=list)
    mask_in_us: list[float] = field(default_factory=list)
    mask_out_us: list[float] = field(default_factory=list)
    rejected_at: int | None = None
    """Token index where the ground-truth walk was rejected (off-schema answers), if it was."""
    engine_ms: float | None = None
    """Of ``cold_ms``, the time inside xgrammar's ``compile_grammar`` (the default engine)."""
    peer_ms: float | None = None
    """The same set's cold compile on raw xgrammar as vLLM builds it (``--peer``; None where
    vLLM's tag refuses the set)."""


class TimedXGrammar:
    """xgrammar's ``GrammarCompiler`` behind our engine, timing its ``compile_grammar`` calls
    (from the compile pool's thread): the engine's share of a cold compile."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ms = 0.0

    def compile_grammar(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.inner.compile_grammar(*args, **kwargs)
        finally:
            self.ms += (time.perf_counter() - start) * 1e3

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @classmethod
    def install(cls, compiler: ToolGrammarCompiler) -> TimedXGrammar | None:
        """Wrap the xgrammar compiler of ``compiler``'s engine (xgrammar, or auto's xgrammar)."""
        engine = getattr(compiler.engine, "xgrammar", compiler.engine)
        if not isinstance(engine, XGrammarEngine):
            return None
        timed = cls(engine._compiler)
        engine._compiler = timed
        return timed


def peer_cold(peer: agent_scale.Vllm, case: BfclCase) -> float | None:
    """Milliseconds of vLLM's cold compile of ``case``'s tools on raw xgrammar (in standard JSON
    Schema, as a client sends them: BFCL's ``dict``, ``float``, ``tuple`` renamed); None if refused."""
    tools = [
        {
            "type": "function",
            "function": {**t, "parameters": bfcl_to_json_schema(copy.deepcopy(t.get("parameters", {})))},
        }
        for t in case.tools
    ]
    try:
        return agent_scale.timed(peer.cold, tools)
    except (RuntimeError, ValueError):
        return None


def tool_sets(limit: int | None) -> list[BfclCase]:
    """The distinct BFCL tool sets (first question of each), or ``limit`` of them spread evenly."""
    seen: dict[str, BfclCase] = {}
    for path in bfcl_files():
        for case in load_bfcl(path):
            seen.setdefault(canonical_json(case.tools), case)
    cases = list(seen.values())
    if limit is not None and limit < len(cases):
        step = len(cases) / limit
        cases = [cases[int(i * step)] for i in range(limit)]
    return cases


def walk_text(case: BfclCase) -> str:
    """Free text, one hermes call (the first ground-truth call, else the first tool with ``{}``), text."""
    names = {t.get("name") for t in case.tools}
    for answer in case.ground_truth or []:
        for name, raw in answer.items():
            if name in names:
                return PREFIX + call_text(name, ground_truth_arguments(raw), compact=False) + SUFFIX
    return PREFIX + call_text(str(case.tools[0].get("name")), {}, compact=False) + SUFFIX


def measure_set(
    compiler: ToolGrammarCompiler,
    case: BfclCase,
    span: tuple[int, int],
    engine: TimedXGrammar | None = None,
    peer: agent_scale.Vllm | None = None,
    peer_first: bool = False,
) -> SetResult:
    result = SetResult(case.id, len(case.tools))
    if peer is not None and peer_first:
        result.peer_ms = peer_cold(peer, case)
    start = time.perf_counter()
    try:
        prepared = compiler.prepare(case.tools)
    except ToolSchemaError as err:
        return SetResult(case.id, len(case.tools), "refused", str(err)[:300])
    result.prepare_ms = (time.perf_counter() - start) * 1e3
    if engine is not None:
        engine.ms = 0.0
    start = time.perf_counter()
    try:
        compiled = compiler.result(prepared, compiler.submit(prepared))
    except GrammarCompileError as err:
        return SetResult(case.id, len(case.tools), "refused", str(err)[:300])
    result.cold_ms = (time.perf_counter() - start) * 1e3
    if engine is not None:
        result.engine_ms = engine.ms
    if peer is not None and not peer_first:
        result.peer_ms = peer_cold(peer, case)
    result.size_bytes = compiled.memory_bytes
    for _ in range(CACHED_REPEATS):
        start = time.perf_counter()
        compiler.result(prepared, compiler.submit(prepared))
        result.cached_us.append((time.perf_counter() - start) * 1e6)
    raw = constraint_args(case.tools, coverage=compiler.coverage)[ARGS_KEY]
    engine_cls = type(compiler.engine)
    for _ in range(CACHED_REPEATS):
        text = "".join(raw)  # a new request's text: a new string, its hash not yet computed
        start = time.perf_counter()
        request = decode_constraint(text)
        hit = prepare_constraint(request, engine_cls, compiler.limits, admitted=True)
        compiler.result(hit, compiler.submit(hit))
        result.hit_us.append((time.perf_counter() - start) * 1e6)
    result.first_admission_us = result.hit_us.pop(0)
    for _ in range(CACHED_REPEATS):
        start = time.perf_counter()
        compiler.compile(case.tools)
        result.again_us.append((time.perf_counter() - start) * 1e6)
    _walk(compiler, compiled, walk_text(case), span, result)
    return result


def _walk(
    compiler: ToolGrammarCompiler,
    compiled: CompiledToolGrammar,
    text: str,
    span: tuple[int, int],
    result: SetResult,
) -> None:
    """Fill the mask before each token and accept it; inside = after the call tag, up to its end tag."""
    tokenizer = compiler.vocab.tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False)
    matcher = compiled.matcher()
    bitmask = allocate_bitmask(1, compiler.vocab.vocab_size)
    inside = False
    for index, token in enumerate(ids):
        start = time.perf_counter_ns()
        matcher.fill_bitmask(bitmask, 0)
        elapsed = (time.perf_counter_ns() - start) / 1e3
        (result.mask_in_us if inside else result.mask_out_us).append(elapsed)
        if not matcher.accept_token(token):
            result.rejected_at = index
            return
        inside = token == span[0] or (inside and token != span[1])


def stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    array = np.asarray(values, dtype=float)
    return {
        "n": len(array),
        "p50": float(np.percentile(array, 50)),
        "p99": float(np.percentile(array, 99)),
        "max": float(array.max()),
    }


def summarise(results: Sequence[SetResult], ids: set[str] | None = None) -> dict[str, dict[str, float]]:
    """Percentiles of every metric over the compiled sets (restricted to ``ids`` when given)."""
    done = [r for r in results if r.status == "compiled" and (ids is None or r.id in ids)]
    per_value: dict[str, list[float]] = {
        "cold_ms": [r.cold_ms for r in done],
        "prepare_ms": [r.prepare_ms for r in done],
    }
    per_value["size_bytes"] = [float(r.size_bytes) for r in done]
    per_value["first_admission_us"] = [r.first_admission_us for r in done]
    for name in ("cached_us", "hit_us", "again_us", "mask_in_us", "mask_out_us"):
        per_value[name] = [v for r in done for v in getattr(r, name)]
    return {name: stats(per_value[name]) for name in METRICS}


def against_raw(results: Sequence[SetResult]) -> dict[str, Any] | None:
    """Cold compiles split into xgrammar's share and ours, and against the peer (raw xgrammar as
    vLLM builds it) on the sets both compiled; None where neither was measured."""
    done = [r for r in results if r.status == "compiled" and r.engine_ms is not None]
    if not done:
        return None
    out: dict[str, Any] = {
        "sets": len(done),
        "cold_ms": stats([r.cold_ms for r in done]),
        "xgrammar_share_ms": stats([r.engine_ms or 0.0 for r in done]),
        "rest_ms": stats([r.cold_ms - (r.engine_ms or 0.0) for r in done]),
    }
    both = [r for r in done if r.peer_ms is not None]
    if both:
        out["peer_sets"] = len(both)
        out["ours_on_peer_sets_ms"] = stats([r.cold_ms for r in both])
        out["peer_ms"] = stats([r.peer_ms or 0.0 for r in both])
        slowest = sorted(both, key=lambda r: r.cold_ms, reverse=True)[:3]
        out["slowest"] = [
            {
                "id": r.id,
                "tools": r.tools,
                "ours_ms": r.cold_ms,
                "xgrammar_share_ms": r.engine_ms,
                "peer_ms": r.peer_ms,
            }
            for r in slowest
        ]
    return out


def _compiler(engine: str, tokenizer_name: str, cache: GrammarCache[EngineGrammar]) -> ToolGrammarCompiler:
    """A lenient compiler for the tiny model of ``tokenizer_name``, as wide as its logits."""
    from transformers import AutoTokenizer

    model = tiny_model_path(tokenizer_name)  # type: ignore[arg-type]
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    width = json.loads((model / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    dialect = DIALECT_OF.get(tokenizer_name, "hermes")
    return ToolGrammarCompiler(
        tokenizer, engine=engine, dialect=dialect, vocab_size=width, coverage="lenient", cache=cache
    )


class FullCollections:
    """The garbage collector's full (oldest-generation) collections while it is on: each one's
    milliseconds, and the objects it could reach."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self._start = 0.0

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.ms.append((time.perf_counter() - self._start) * 1e3)


def run(
    engine: str, tokenizer_name: str, cases: Sequence[BfclCase], freeze: bool = True, peer: bool = False
) -> tuple[list[SetResult], dict[str, Any]]:
    """Each set measured in turn after the compiler's start-up (``ToolGrammarCompiler.warm``); with
    ``freeze``, the heap built so far frozen then, as vLLM's engine core does after its start-up
    (``freeze_gc_heap``), so full collections walk only what serving added. With ``peer`` (the
    default engine only), each set is compiled by vLLM's structural tag on raw xgrammar too."""
    compiler = _compiler(engine, tokenizer_name, GrammarCache(2 << 30, 1, lambda g: g.memory_bytes))
    timed = TimedXGrammar.install(compiler) if engine == DEFAULT_ENGINE else None
    vllm_side = agent_scale.Vllm(compiler) if peer and engine == DEFAULT_ENGINE else None
    tokenizer = compiler.vocab.tokenizer
    span = (
        tokenizer.convert_tokens_to_ids(compiler.dialect.tool_call.begin),
        tokenizer.convert_tokens_to_ids(compiler.dialect.tool_call.end),
    )
    start = time.perf_counter()
    compiler.warm()  # one-time vocabulary setup
    if vllm_side is not None:
        vllm_side.fresh()  # the peer's compiler and its first compile, at start-up too
    setup_s = time.perf_counter() - start
    if freeze:
        gc.collect()
        gc.freeze()
    results = []
    with FullCollections() as full:
        for i, case in enumerate(cases):
            results.append(measure_set(compiler, case, span, timed, vllm_side, peer_first=i % 2 == 1))
            if (i + 1) % 200 == 0:
                print(f"  {engine}/{tokenizer_name}: {i + 1}/{len(cases)}", file=sys.stderr, flush=True)
    collections = {
        "frozen": gc.get_freeze_count(),
        "tracked": len(gc.get_objects()),
        "full_collections_ms": [round(ms, 1) for ms in full.ms],
    }
    if freeze:
        gc.unfreeze()
    print(
        f"{engine}/{tokenizer_name}: {len(cases)} tool sets, setup {setup_s:.1f} s, {collections}",
        file=sys.stderr,
        flush=True,
    )
    return results, collections


def report(all_results: dict[tuple[str, str], list[SetResult]]) -> list[dict[str, Any]]:
    """Per engine and tokenizer: counts, percentiles, and ratios to the default engine on the same sets."""
    rows = []
    for (engine, tok), results in all_results.items():
        compiled = {r.id for r in results if r.status == "compiled"}
        row: dict[str, Any] = {
            "engine": engine,
            "tokenizer": tok,
            "tool_sets": len(results),
            "compiled": len(compiled),
            "refused": [{"id": r.id, "message": r.message} for r in results if r.status != "compiled"][:20],
            "walks_rejected": sum(r.rejected_at is not None for r in results if r.status == "compiled"),
            **summarise(results),
        }
        raw = against_raw(results)
        if raw is not None:
            row["against_raw_xgrammar"] = raw
        baseline = all_results.get((DEFAULT_ENGINE, tok))
        if baseline is not None:
            common = compiled & {r.id for r in baseline if r.status == "compiled"}
            mine, theirs = summarise(results, common), summarise(baseline, common)
            row["ratio_to_default"] = {
                m: {q: mine[m][q] / theirs[m][q] for q in ("p50", "p99") if theirs[m].get(q)}
                for m in METRICS
                if mine[m]["n"] and theirs[m]["n"]
            }
            row["ratio_sets"] = len(common)
        rows.append(row)
    return rows


def _fmt(stat: dict[str, float], key: str, scale: float = 1.0) -> str:
    return f"{stat[key] * scale:.3g}" if stat.get(key) is not None and stat["n"] else "-"


def markdown(meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| engine | tokenizer | sets compiled | cold p50 / p99 (ms) | cached p50 / p99 (us) "
        "| engine hit p50 / p99 (us) | first admission p50 / p99 (us) | compile again p50 / p99 (us) "
        "| prepare p50 (ms) "
        "| mask in p50 / p99 (us) | mask out p50 / p99 (us) | size p50 / max (KiB) |"
    )
    lines = [
        "# Grammar compile and mask-fill cost over BFCL tool sets",
        "",
        f"{meta['cpus']} CPUs ({meta['machine']}), shared; xgrammar {meta['versions']['xgrammar']}, "
        f"llguidance {meta['versions']['llguidance']}, outlines-core {meta['versions']['outlines-core']}; "
        f"lenient coverage; {meta['seconds']:.0f} s. Limits: {meta['limits'] or 'none'}.",
        "",
        head,
        "|" + " --- |" * 12,
    ]
    for r in rows:
        cells = [
            r["engine"],
            r["tokenizer"],
            f"{r['compiled']}/{r['tool_sets']}",
            f"{_fmt(r['cold_ms'], 'p50')} / {_fmt(r['cold_ms'], 'p99')}",
            f"{_fmt(r['cached_us'], 'p50')} / {_fmt(r['cached_us'], 'p99')}",
            f"{_fmt(r['hit_us'], 'p50')} / {_fmt(r['hit_us'], 'p99')}",
            f"{_fmt(r['first_admission_us'], 'p50')} / {_fmt(r['first_admission_us'], 'p99')}",
            f"{_fmt(r['again_us'], 'p50')} / {_fmt(r['again_us'], 'p99')}",
            _fmt(r["prepare_ms"], "p50"),
            f"{_fmt(r['mask_in_us'], 'p50')} / {_fmt(r['mask_in_us'], 'p99')}",
            f"{_fmt(r['mask_out_us'], 'p50')} / {_fmt(r['mask_out_us'], 'p99')}",
            f"{_fmt(r['size_bytes'], 'p50', 1 / 1024)} / {_fmt(r['size_bytes'], 'max', 1 / 1024)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Ratios to the default engine (same run, same tool sets; p50, p99 in brackets)", ""]
    lines += [
        "| engine | tokenizer | sets | " + " | ".join(METRICS) + " |",
        "|" + " --- |" * (3 + len(METRICS)),
    ]
    for r in rows:
        ratios = r.get("ratio_to_default", {})
        cells = [
            f"{ratios[m]['p50']:.2g} ({ratios[m].get('p99', float('nan')):.2g})" if m in ratios else "-"
            for m in METRICS
        ]
        lines.append(
            f"| {r['engine']} | {r['tokenizer']} | {r.get('ratio_sets', '-')} | " + " | ".join(cells) + " |"
        )
    raw_rows = [r for r in rows if "against_raw_xgrammar" in r]
    if raw_rows:
        lines += [
            "",
            "## Cold compile against raw xgrammar (ms, p50 / p99)",
            "",
            "xgrammar's share: the time inside its `compile_grammar` in our cold compile; the rest: "
            "writing the EBNF and its passes, xgrammar's JSON-schema conversion and EBNF parse, the "
            "compile pool's hand-off; peer: vLLM's structural tag compiled by raw xgrammar with "
            "vLLM's backend settings, on the sets both compiled.",
            "",
            "| tokenizer | sets | ours | of which xgrammar | the rest | peer sets | ours there "
            "| peer (raw xgrammar) |",
            "|" + " --- |" * 8,
        ]
        for r in raw_rows:
            raw = r["against_raw_xgrammar"]
            cells = [
                f"{_fmt(raw[key], 'p50')} / {_fmt(raw[key], 'p99')}" if key in raw else "-"
                for key in ("cold_ms", "xgrammar_share_ms", "rest_ms")
            ]
            cells.append(str(raw.get("peer_sets", "-")))
            cells += [
                f"{_fmt(raw[key], 'p50')} / {_fmt(raw[key], 'p99')}" if key in raw else "-"
                for key in ("ours_on_peer_sets_ms", "peer_ms")
            ]
            lines.append(f"| {r['tokenizer']} | {raw['sets']} | " + " | ".join(cells) + " |")
    lines += ["", "## Targets (issue 3: 2 cores, 131k vocabulary, default engine)", ""]
    for r in rows:
        if r["engine"] != DEFAULT_ENGINE:
            continue
        checks = [
            f"{m} {q} {r[m][q]:.3g} <= {bound:g}: {'ok' if r[m][q] <= bound else 'MISSED'}"
            for m, bounds in TARGETS.items()
            for q, bound in bounds.items()
            if r[m].get(q) is not None
        ]
        lines.append(f"- {r['tokenizer']}: " + "; ".join(checks))
    return "\n".join(lines) + "\n"


def chart(rows: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("cold_ms", "cold compile (ms)"),
        ("cached_us", "cache hit (us)"),
        ("hit_us", "engine's admission, same set (us)"),
        ("again_us", "compile again (us)"),
        ("mask_in_us", "mask fill in span (us)"),
        ("mask_out_us", "mask fill outside (us)"),
        ("size_bytes", "grammar size (bytes)"),
        ("prepare_ms", "prepare (ms)"),
    ]
    labels = [f"{r['engine']}\n{r['tokenizer']}" for r in rows]
    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    for ax, (metric, title) in zip(axes.flat[: len(panels)], panels, strict=True):
        x = np.arange(len(rows))
        for offset, q in ((-0.2, "p50"), (0.2, "p99")):
            ax.bar(x + offset, [r[metric].get(q, 0) for r in rows], 0.4, label=q)
        for bound_q, bound in TARGETS.get(metric, {}).items():
            ax.axhline(bound, color="red", linestyle="--", linewidth=0.8, label=f"target {bound_q}")
        ax.set_yscale("log")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_title(title)
        ax.legend(fontsize=7)
    agent_scale.save_figure(fig, "Grammar engines over BFCL tool sets (lower is better; log scale)", path)


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def agent_scale_main(args: argparse.Namespace, command: str) -> int:
    """``--agent-scale``: one tokenizer (the first of ``--tokenizers``; tekken when not given)."""
    tok = args.tokenizers.split(",")[0] if args.tokenizers != DEFAULT_TOKENIZERS else "tekken"
    compiler = _compiler(DEFAULT_ENGINE, tok, GrammarCache(2 << 30, 1, lambda g: g.memory_bytes))
    result = agent_scale.run(
        compiler,
        [int(n) for n in args.sizes.split(",")],
        args.repeats,
        lambda line: print(line, file=sys.stderr, flush=True),
    )
    summary = agent_scale.summarise(result)
    meta = {
        "cpus": os.cpu_count(),
        "tokenizer": tok,
        "xgrammar": version("xgrammar"),
        "vllm": vllm_version(),
        "repeats": args.repeats,
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    out: Path = args.out or RESULTS / "compile-agents.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, **summary, **result}, indent=1) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(agent_scale.markdown(meta, summary), encoding="utf-8")
    agent_scale.chart(summary, out.with_suffix(".png"))
    print(agent_scale.markdown(meta, summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="xgrammar,llguidance,outlines")
    parser.add_argument("--tokenizers", default=DEFAULT_TOKENIZERS)
    parser.add_argument("--limit", type=int, help="tool sets per engine (spread evenly); default: all")
    parser.add_argument(
        "--engine-limit", action="append", default=[], metavar="ENGINE=N", help="per-engine --limit"
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--no-freeze", action="store_true", help="leave the start-up heap to the collector (vLLM freezes it)"
    )
    parser.add_argument(
        "--peer", action="store_true", help="each set on raw xgrammar too, as vLLM builds it (default engine)"
    )
    parser.add_argument("--agent-scale", action="store_true", help="1-400 tools against vLLM's tag")
    parser.add_argument("--sizes", default=",".join(map(str, agent_scale.SIZES)))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.agent_scale:
        return agent_scale_main(args, " ".join(["python benchmarks/compile.py", *(argv or sys.argv[1:])]))
    args.out = args.out or RESULTS / "compile.json"
    logging.getLogger("hermes_vllm").setLevel(logging.ERROR)
    limits = {e: int(n) for e, n in (item.split("=") for item in args.engine_limit)}
    engines, tokenizers = args.engines.split(","), args.tokenizers.split(",")
    unknown = set(tokenizers) - set(TOKENIZER_NAMES)
    if unknown:
        parser.error(f"unknown tokenizers {sorted(unknown)}; choose from {', '.join(TOKENIZER_NAMES)}")
    all_cases = tool_sets(args.limit)
    start = time.perf_counter()
    results: dict[tuple[str, str], list[SetResult]] = {}
    collections: dict[str, dict[str, Any]] = {}
    for tok in tokenizers:
        for engine in engines:
            limit = limits.get(engine)
            cases = (
                all_cases
                if limit is None
                else [all_cases[int(i * len(all_cases) / limit)] for i in range(limit)]
            )
            results[(engine, tok)], collections[f"{engine}/{tok}"] = run(
                engine, tok, cases, not args.no_freeze, args.peer
            )
    rows = report(results)
    meta = {
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "versions": {p: version(p) for p in ("xgrammar", "llguidance", "outlines-core", "transformers")},
        "limits": {"all": args.limit, **limits} if args.limit or limits else None,
        "seconds": time.perf_counter() - start,
        "targets": TARGETS,
        "freeze": not args.no_freeze,
        "gc": collections,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    per_set = {
        f"{e}/{t}": [
            {
                k: v
                for k, v in asdict(r).items()
                if k not in ("cached_us", "hit_us", "mask_in_us", "mask_out_us")
            }
            for r in rs
        ]
        for (e, t), rs in results.items()
    }
    args.out.write_text(
        json.dumps({"meta": meta, "runs": rows, "per_set": per_set}, indent=1) + "\n", encoding="utf-8"
    )
    args.out.with_suffix(".md").write_text(markdown(meta, rows), encoding="utf-8")
    chart(rows, args.out.with_suffix(".png"))
    print(markdown(meta, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
