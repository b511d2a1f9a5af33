"""The reference corpora (JSON-Schema-Test-Suite, BFCL): where they live and how to read them.

The corpora are read-only data kept beside the checkout (``<repo>/../shared/corpus``, the same in
CI), never copied into the repository; ``$HERMES_VLLM_CORPUS`` points elsewhere.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS_ENV = "HERMES_VLLM_CORPUS"
SUITE_DRAFT = "draft2020-12"
_REPO = Path(__file__).resolve().parents[2]


class CorpusMissing(FileNotFoundError):
    """The corpus folder is absent; the message says where it was looked for (tests skip with it)."""


def corpus_dir() -> Path:
    """``$HERMES_VLLM_CORPUS`` if set, else ``<repo>/../shared/corpus`` (or ``<cwd>/../shared/corpus``)."""
    override = os.environ.get(CORPUS_ENV)
    candidates = (
        [Path(override)]
        if override
        else [_REPO.parent / "shared" / "corpus", Path.cwd().parent / "shared" / "corpus"]
    )
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    raise CorpusMissing(f"reference corpus not found (looked in {looked}); set {CORPUS_ENV} to its folder")


def suite_files() -> list[Path]:
    """The draft 2020-12 keyword files of the JSON-Schema-Test-Suite (``optional/`` excluded)."""
    return sorted((corpus_dir() / "json-schema-test-suite" / "tests" / SUITE_DRAFT).glob("*.json"))


def load_suite_file(path: Path) -> list[dict[str, Any]]:
    """One keyword file: a list of ``{description, schema, tests: [{description, data, valid}]}``."""
    groups: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return groups


@dataclass(frozen=True)
class BfclCase:
    """One BFCL question: its tool set and the acceptable calls (None when it has no ground truth)."""

    id: str
    tools: list[dict[str, Any]]
    ground_truth: list[dict[str, dict[str, list[Any]]]] | None


def bfcl_files() -> list[Path]:
    """The ``BFCL_v4_*.json`` question files."""
    return sorted((corpus_dir() / "bfcl").glob("BFCL_v4_*.json"))


def _json_lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def load_bfcl(path: Path) -> list[BfclCase]:
    """The questions of one BFCL file, joined by id with ``possible_answer/<same name>``."""
    answers_path = path.parent / "possible_answer" / path.name
    answers = {a["id"]: a["ground_truth"] for a in _json_lines(answers_path)} if answers_path.exists() else {}
    return [BfclCase(q["id"], q["function"], answers.get(q["id"])) for q in _json_lines(path)]
