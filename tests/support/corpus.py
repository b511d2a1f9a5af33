"""The reference corpora (JSON-Schema-Test-Suite, BFCL): where they live and how to read them.

Both come from the package registries: BFCL v4 from the ``bfcl-eval`` wheel (``bfcl_eval/data``),
the test suite from the ``jsonschema`` sdist (``json/tests``), each pinned by sha256
(:mod:`hermes_vllm.testing.artifacts`) and unpacked once per machine into the artifact cache, in
the layout ``bfcl/BFCL_v4_*.json``, ``bfcl/possible_answer/``,
``json-schema-test-suite/tests/draft2020-12/``. ``$HERMES_VLLM_CORPUS`` points at a folder of that
layout instead (``../shared/corpus`` in this workplace: the same BFCL files, a newer test suite).
"""

from __future__ import annotations

import copy
import json
import os
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

from hermes_vllm.schema import bfcl_to_json_schema
from hermes_vllm.testing.artifacts import Artifact, fetch, unpacked

CORPUS_ENV = "HERMES_VLLM_CORPUS"
SUITE_DRAFT = "draft2020-12"

BFCL_WHEEL = Artifact(
    "bfcl-eval",
    "2026.3.23",
    "bfcl_eval-2026.3.23-py3-none-any.whl",
    "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a",
)
SUITE_SDIST = Artifact(
    "jsonschema",
    "4.25.1",
    "jsonschema-4.25.1.tar.gz",
    "e4a9655ce0da0c0b67a085847e00a3a51449e1157f4f75e9fb5aa545e122eb85",
)
BFCL_FILES = (
    "BFCL_v4_live_multiple.json",
    "BFCL_v4_live_parallel.json",
    "BFCL_v4_live_parallel_multiple.json",
    "BFCL_v4_live_simple.json",
    "BFCL_v4_multiple.json",
    "BFCL_v4_parallel.json",
    "BFCL_v4_parallel_multiple.json",
    "BFCL_v4_simple_python.json",
)
"""The single-turn function-calling categories with tool sets and ground truth (the wheel also
holds multi-turn, memory and web-search data in other shapes)."""
_CORPUS_LAYOUT = 1
"""Bump when the unpacked layout changes, so cached corpora are unpacked again."""


class CorpusMissing(FileNotFoundError):
    """``$HERMES_VLLM_CORPUS`` names no folder; the message says where it was looked for."""


def corpus_dir() -> Path:
    """``$HERMES_VLLM_CORPUS`` if set, else the corpora unpacked from their pinned registry files
    (fetched on first use). A copy beside the checkout is not read by default: its test suite is
    another revision than the pinned sdist's, and CI must test what a user's machine tests."""
    override = os.environ.get(CORPUS_ENV)
    if override:
        if not Path(override).is_dir():
            raise CorpusMissing(f"{CORPUS_ENV}={override}: no such folder")
        return Path(override)
    return registry_corpus()


@cache
def registry_corpus() -> Path:
    """The corpora unpacked from the pinned ``bfcl-eval`` wheel and ``jsonschema`` sdist."""
    return unpacked(f"corpus-v{_CORPUS_LAYOUT}", _unpack_corpus)


def _unpack_corpus(staging: Path) -> None:
    wanted = {f"bfcl_eval/data/{name}": f"bfcl/{name}" for name in BFCL_FILES}
    wanted |= {f"bfcl_eval/data/possible_answer/{n}": f"bfcl/possible_answer/{n}" for n in BFCL_FILES}
    with zipfile.ZipFile(fetch(BFCL_WHEEL)) as wheel:
        for member, dest in wanted.items():
            if member in wheel.namelist():
                _write(staging / dest, wheel.read(member))
    suite = f"json/tests/{SUITE_DRAFT}/"
    with tarfile.open(fetch(SUITE_SDIST)) as sdist:
        for entry in sdist.getmembers():
            inner = PurePosixPath(*PurePosixPath(entry.name).parts[1:]).as_posix()
            if entry.isfile() and inner.startswith(suite):
                data = sdist.extractfile(entry)
                assert data is not None
                path = staging / "json-schema-test-suite" / "tests" / inner[len("json/tests/") :]
                _write(path, data.read())


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


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


def as_openai_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function as an OpenAI client sends it: a function tool, its parameters in standard
    JSON Schema (BFCL's ``dict``, ``float``, ``tuple`` renamed)."""
    parameters = bfcl_to_json_schema(copy.deepcopy(function.get("parameters") or {"type": "object"}))
    return {"type": "function", "function": {**function, "parameters": parameters}}


def agent_tool_set(count: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``count`` distinct satisfiable BFCL tools and the unsatisfiable one, as a client sends them:
    the shape of an agent's request (one widely used coding client sends 139 tools)."""
    functions = bfcl_functions()
    good = [as_openai_tool(f) for n, f in functions.items() if n != UNSATISFIABLE_BFCL_TOOL][:count]
    return good, as_openai_tool(functions[UNSATISFIABLE_BFCL_TOOL])
