"""The figures behind the agent-scale design (docs/architecture.md, "Many tools"): what composing
at the matcher would cost on xgrammar, against the monolithic turn grammar, in one run.

    python benchmarks/compose_probe.py [--tools 400] [--out benchmarks/results/compose-probe.json]

- ``head_cold_ms`` / ``head_cached_ms``: the turn with the name a generic JSON string and the
  arguments a generic object (the same grammar for every tool set of a dialect and mode);
- ``per_tool_ms``: each tool's one-tool turn grammar compiled on its own (xgrammar's cache warm
  from the previous ones), as a lazily compiled per-tool grammar would be;
- ``monolithic_ms``: the whole set as one grammar (EBNF, folding, merging, xgrammar's compile).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import agent_scale
import numpy as np
import xgrammar as xgr
from compile import RESULTS, _compiler

from hermes_vllm.grammar.cache import GrammarCache
from hermes_vllm.grammar.engines.ebnf import fold_gaps, merge_equal_rules
from hermes_vllm.grammar.engines.xgrammar import XGrammarEngine, _is_basic, turn_ebnf
from hermes_vllm.turn import TurnSpec

GENERIC = "probe_generic_name"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULTS / "compose-probe.json")
    args = parser.parse_args(argv)
    compiler = _compiler("xgrammar", "tekken", GrammarCache(2 << 30, 1, lambda g: g.memory_bytes))
    tools, _ = agent_scale.distinct_tools(args.tools, lambda t: True)
    spec = compiler.prepare(tools, admitted=True).spec
    engine = XGrammarEngine(compiler.vocab)
    engine.compile(compiler.prepare([{"name": "warm_up"}]).spec)

    def ms(fn: Any) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    generic = compiler.prepare([{"name": GENERIC, "parameters": {"type": "object"}}], admitted=True).spec
    head = turn_ebnf(generic).replace(f'"\\"{GENERIC}\\""', "basic_string")
    head = merge_equal_rules(fold_gaps(head, _is_basic), _is_basic)
    figures: dict[str, Any] = {
        "head_cold_ms": ms(lambda: engine._compiler.compile_grammar(xgr.Grammar.from_ebnf(head))),
        "head_cached_ms": ms(lambda: engine._compiler.compile_grammar(xgr.Grammar.from_ebnf(head))),
    }
    per_tool = [
        ms(
            lambda t=tool: engine.compile(
                TurnSpec(spec.dialect, (t,), spec.mode, spec.parallel, spec.max_whitespace)
            )
        )
        for tool in spec.tools
    ]
    figures["per_tool_ms"] = {
        "median": float(np.median(per_tool)),
        "max": max(per_tool),
        "total": sum(per_tool),
    }
    figures["monolithic_ms"] = ms(lambda: XGrammarEngine(compiler.vocab).compile(spec))
    meta = {
        "tools": len(spec.tools),
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
        "tokenizer": "tekken",
    }
    args.out.write_text(json.dumps({"meta": meta, **figures}, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({"meta": meta, **figures}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
