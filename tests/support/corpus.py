"""The reference corpora of the tests and benchmarks (JSON-Schema-Test-Suite, BFCL): where they live
and how to read them.

Both come from the package registries: BFCL v4 from the ``bfcl-eval`` wheel
(:mod:`hermes_vllm.demo.bfcl`, which the demo's model trains on), the test suite from the
``jsonschema`` sdist (``json/tests``), each pinned by sha256 (:mod:`hermes_vllm.testing.artifacts`)
and unpacked once per machine into the artifact cache. ``$HERMES_VLLM_CORPUS`` points at a folder
holding both instead, in the layout ``bfcl/BFCL_v4_*.json``, ``bfcl/possible_answer/``,
``json-schema-test-suite/tests/draft2020-12/`` (``../shared/corpus`` in this workplace: the same
BFCL files, a newer test suite).
"""

from __future__ import annotations

import json
import os
import tarfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

from hermes_vllm.demo.bfcl import as_openai_tool, json_lines, registry_bfcl
from hermes_vllm.testing.artifacts import Artifact, fetch, unpacked

CORPUS_ENV = "HERMES_VLLM_CORPUS"
SUITE_DRAFT = "draft2020-12"

SUITE_SDIST = Artifact(
    "jsonschema",
    "4.25.1",
    "jsonschema-4.25.1.tar.gz",
    "e4a9655ce0da0c0b67a085847e00a3a51449e1157f4f75e9fb5aa545e122eb85",
)
_SUITE_LAYOUT = 1
"""Bump when the unpacked layout changes, so cached copies are unpacked again."""


class CorpusMissing(FileNotFoundError):
    """``$HERMES_VLLM_CORPUS`` names no folder; the message says where it was looked for."""


def _override() -> Path | None:
    """``$HERMES_VLLM_CORPUS`` if set. A copy beside the checkout is not read by default: its test
    suite is another revision than the pinned sdist's, and CI must test what a user's machine tests."""
    override = os.environ.get(CORPUS_ENV)
    if not override:
        return None
    if not Path(override).is_dir():
        raise CorpusMissing(f"{CORPUS_ENV}={override}: no such folder")
    return Path(override)


def bfcl_dir() -> Path:
    """The BFCL files: ``$HERMES_VLLM_CORPUS/bfcl``, else those of the pinned wheel (fetched on first use)."""
    override = _override()
    return override / "bfcl" if override else registry_bfcl()


def suite_dir() -> Path:
    """The draft 2020-12 folder of the JSON-Schema-Test-Suite: from ``$HERMES_VLLM_CORPUS``, else
    from the pinned sdist (fetched on first use)."""
    override = _override()
    return override / "json-schema-test-suite" / "tests" / SUITE_DRAFT if override else registry_suite()


@cache
def registry_suite() -> Path:
    """The test suite's draft 2020-12 files unpacked from the pinned ``jsonschema`` sdist."""
    return unpacked(f"json-schema-test-suite-v{_SUITE_LAYOUT}", _unpack_suite)


def _unpack_suite(staging: Path) -> None:
    suite = f"json/tests/{SUITE_DRAFT}/"
    with tarfile.open(fetch(SUITE_SDIST)) as sdist:
        for entry in sdist.getmembers():
            inner = PurePosixPath(*PurePosixPath(entry.name).parts[1:]).as_posix()
            if entry.isfile() and inner.startswith(suite):
                data = sdist.extractfile(entry)
                assert data is not None
                path = staging / inner[len(suite) :]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data.read())


def suite_files() -> list[Path]:
    """The draft 2020-12 keyword files of the JSON-Schema-Test-Suite (``optional/`` excluded)."""
    return sorted(suite_dir().glob("*.json"))


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
    return sorted(bfcl_dir().glob("BFCL_v4_*.json"))


def load_bfcl(path: Path) -> list[BfclCase]:
    """The questions of one BFCL file, joined by id with ``possible_answer/<same name>``."""
    answers_path = path.parent / "possible_answer" / path.name
    answers = {a["id"]: a["ground_truth"] for a in json_lines(answers_path)} if answers_path.exists() else {}
    return [BfclCase(q["id"], q["function"], answers.get(q["id"])) for q in json_lines(path)]


def sample_tool_sets(count: int, seed: int = 1) -> list[list[dict[str, Any]]]:
    """``count`` BFCL tool sets drawn from all files (the same ones for the same seed)."""
    import random

    sets = [case.tools for path in bfcl_files() for case in load_bfcl(path)]
    random.Random(seed).shuffle(sets)
    return sets[:count]


UNSATISFIABLE_BFCL_TOOL = "extract_parameters_v1"
"""The BFCL tool no call can satisfy: a required ``"type": "array"`` property with a string ``enum``."""


def bfcl_functions() -> dict[str, dict[str, Any]]:
    """Every distinct BFCL function by name (the first definition met, files in name order)."""
    found: dict[str, dict[str, Any]] = {}
    for path in bfcl_files():
        for case in load_bfcl(path):
            for function in case.tools:
                found.setdefault(function["name"], function)
    return found


def agent_tool_set(count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``count`` distinct satisfiable BFCL tools and the unsatisfiable one, as a client sends them:
    the shape of an agent's request (one widely used coding client sends 139 tools)."""
    functions = bfcl_functions()
    good = [as_openai_tool(f) for n, f in functions.items() if n != UNSATISFIABLE_BFCL_TOOL][:count]
    return good, as_openai_tool(functions[UNSATISFIABLE_BFCL_TOOL])
