"""Soundness of the tool grammar, measured on the JSON-Schema-Test-Suite and on BFCL.

    python benchmarks/soundness.py [--engine xgrammar] [--tokenizer mistral-v1|tekken] [--out PATH.json]

Writes PATH.json (every outcome), PATH.md (tables, failures, refusals) and PATH.png (rates per
keyword file). What is checked and why is in ``tests/support/soundness.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from support.corpus import bfcl_files, suite_files
from support.soundness import (
    BfclFileReport,
    SuiteFileReport,
    check_bfcl_file,
    check_probes,
    check_suite_file,
)

from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.testing import tiny_model_path

RESULTS = Path(__file__).parent / "results"
_COLUMNS = ("groups", "compiled", "refused", "crashed")


def _rate(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / whole:.0f}%)" if whole else "-"


def _suite_row(report: SuiteFileReport) -> str:
    c = report.counts
    cells = [report.file, *(str(c[k]) for k in _COLUMNS)]
    cells += [_rate(c["valid_accepted"], c["valid_admitted"]), str(c["valid_excluded_by_policy"])]
    cells += [_rate(c["invalid_rejected"], c["invalid"])]
    return "| " + " | ".join(cells) + " |"


def _bfcl_row(r: BfclFileReport) -> str:
    cells = [r.file, str(r.tool_sets), str(r.compiled), str(r.calls), str(len(r.off_schema))]
    cells += [str(len(r.excluded_by_policy)), str(len(r.unknown_function)), _rate(r.accepted, r.on_schema)]
    return "| " + " | ".join(cells) + " |"


def _markdown(meta: dict[str, Any], suite: list[SuiteFileReport], bfcl: list[BfclFileReport]) -> str:
    head = "| file | groups | compiled | refused | crashed | valid accepted / admitted | excluded by policy"
    lines = [
        f"# Soundness: {meta['engine']} on the {meta['tokenizer']} tokenizer",
        "",
        f"xgrammar {meta['xgrammar']}, strict coverage, {meta['seconds']:.0f} s. "
        "A *group* is one schema of the suite; object instances are the call's arguments (keys in "
        'declared order), others travel as `{"value": instance}`. Rates count compiled groups only. '
        "A valid instance that the grammar rejects is a SOUNDNESS BUG; an invalid one it accepts is a "
        "precision gap.",
        "",
        "## JSON-Schema-Test-Suite (draft 2020-12)",
        "",
        head + " | invalid rejected |",
        "|" + " --- |" * 8,
        *(_suite_row(r) for r in suite),
        "",
        "### Failures",
        "",
    ]
    failures = [(r.file, f) for r in suite for f in r.failures()]
    lines += [
        f"- **{f['kind']}** {file}: {f['schema']} / {f['instance']}: `{f['text']}`" for file, f in failures
    ]
    lines += ["- none"] if not failures else []
    lines += ["", "### Valid instances excluded by the object policy (not checked)", ""]
    lines += [f"- {r.file}: {x['schema']} / {x['instance']}" for r in suite for x in r.excluded()]
    lines += ["", "### Refused or crashed schemas", ""]
    for r in suite:
        for s in r.schemas:
            if s.status != "compiled":
                lines.append(f"- {r.file}: {s.description} ({s.status}): {' / '.join(s.messages)}")
    lines += [
        "",
        "## BFCL v4",
        "",
        "Each tool set must compile; each ground-truth call (first acceptable value of each argument, "
        'applied inside dict arguments too; `""` first means "omit") that jsonschema finds valid for '
        "the normalised schema and that our object policy admits must be accepted.",
        "",
        "| file | tool sets | compiled | calls | off-schema | excluded by policy | unknown function "
        "| accepted |",
        "|" + " --- |" * 8,
        *(_bfcl_row(r) for r in bfcl),
        "",
    ]
    for b in bfcl:
        lines += [f"- not compiled, {b.file} {x['id']}: {x['message']}" for x in b.not_compiled]
        lines += [f"- **REJECTED** {b.file} {x['id']}: `{x['text']}`" for x in b.rejected]
        lines += [f"- off-schema, {b.file} {x['id']} {x['function']}: {x['reason']}" for x in b.off_schema]
        lines += [
            f"- excluded by policy, {b.file} {x['id']} {x['function']}: {x['arguments']}"
            for x in b.excluded_by_policy
        ]
    return "\n".join(lines) + "\n"


def _chart(suite: list[SuiteFileReport], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.file.removesuffix(".json") for r in suite]
    rates = {
        "schemas compiled": [r.counts["compiled"] / max(r.counts["groups"], 1) for r in suite],
        "valid accepted": [r.counts["valid_accepted"] / max(r.counts["valid_admitted"], 1) for r in suite],
        "invalid rejected": [r.counts["invalid_rejected"] / max(r.counts["invalid"], 1) for r in suite],
    }
    fig, ax = plt.subplots(figsize=(14, 5))
    width = 0.27
    for i, (label, values) in enumerate(rates.items()):
        ax.bar([x + (i - 1) * width for x in range(len(names))], values, width, label=label)
    ax.set_xticks(range(len(names)), names, rotation=75, ha="right", fontsize=8)
    ax.set_ylabel("fraction (rates over compiled schemas)")
    ax.set_ylim(0, 1.05)
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="xgrammar")
    parser.add_argument("--tokenizer", default="mistral-v1", choices=["mistral-v1", "tekken"])
    parser.add_argument(
        "--out", type=Path, help="JSON path (default results/soundness-<engine>-<tokenizer>.json)"
    )
    parser.add_argument("--no-bfcl", action="store_true", help="skip the BFCL section")
    args = parser.parse_args(argv)
    out: Path = args.out or RESULTS / f"soundness-{args.engine}-{args.tokenizer}.json"
    logging.getLogger("hermes_vllm").setLevel(logging.WARNING)

    from importlib.metadata import version

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path(args.tokenizer)))
    compiler = ToolGrammarCompiler(tokenizer, engine=args.engine)
    start = time.perf_counter()
    suite = [check_suite_file(compiler, p) for p in suite_files()] + [check_probes(compiler)]
    bfcl = [] if args.no_bfcl else [check_bfcl_file(compiler, p) for p in bfcl_files()]
    meta = {"engine": args.engine, "tokenizer": args.tokenizer, "xgrammar": version("xgrammar")}
    meta["seconds"] = time.perf_counter() - start

    out.parent.mkdir(parents=True, exist_ok=True)
    report = {**meta, "suite": [r.to_json() for r in suite], "bfcl": [r.to_json() for r in bfcl]}
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(_markdown(meta, suite, bfcl), encoding="utf-8")
    _chart(suite, out.with_suffix(".png"), f"JSON-Schema-Test-Suite, {args.engine}, {args.tokenizer}")

    bugs = sum(f["kind"] == "SOUNDNESS BUG" for r in suite for f in r.failures())
    bugs += sum(len(r.rejected) for r in bfcl)
    print(f"{out}: {bugs} soundness failures, {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
