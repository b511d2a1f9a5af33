"""BFCL v4, the corpus the demo's model is trained on and asked from, from its pinned registry wheel.

The ``bfcl-eval`` wheel (``bfcl_eval/data``) is pinned by sha256 (:mod:`hermes_vllm.testing.artifacts`)
and its single-turn files are unpacked once per machine into the artifact cache: ``BFCL_v4_*.json``
(one question a line) and ``possible_answer/`` (the ground truth, by question id).
"""

from __future__ import annotations

import copy
import json
import zipfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from hermes_vllm.schema import bfcl_to_json_schema
from hermes_vllm.testing.artifacts import Artifact, fetch, unpacked

BFCL_WHEEL = Artifact(
    "bfcl-eval",
    "2026.3.23",
    "bfcl_eval-2026.3.23-py3-none-any.whl",
    "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a",
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
_LAYOUT = 1
"""Bump when the unpacked layout changes, so cached copies are unpacked again."""


@cache
def registry_bfcl() -> Path:
    """The BFCL files unpacked from the pinned ``bfcl-eval`` wheel."""
    return unpacked(f"bfcl-v{_LAYOUT}", _unpack)


def _unpack(staging: Path) -> None:
    with zipfile.ZipFile(fetch(BFCL_WHEEL)) as wheel:
        present = set(wheel.namelist())
        for name in BFCL_FILES:
            for inner in (name, f"possible_answer/{name}"):
                if f"bfcl_eval/data/{inner}" in present:
                    path = staging / inner
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(wheel.read(f"bfcl_eval/data/{inner}"))


def json_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The objects of a BFCL file, one a line."""
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                yield json.loads(line)


def as_openai_tool(function: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function as an OpenAI client sends it: a function tool, its parameters in standard
    JSON Schema (BFCL's ``dict``, ``float``, ``tuple`` renamed)."""
    parameters = bfcl_to_json_schema(copy.deepcopy(function.get("parameters") or {"type": "object"}))
    return {"type": "function", "function": {**function, "parameters": parameters}}
