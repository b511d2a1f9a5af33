"""A small tool-calling model trained here, deterministically: a model that tries.

Random-weight models prove the constraint (garbage in, valid calls out) but not what a serving
team asks first: on a model that actually tries to call tools, how many replies does a parser
lose, and does a constraint ever pick a worse tool? No pretrained weights can be downloaded
here, so this module trains one on the CPU from the pinned ``bfcl-eval`` wheel:

- **Data**: every single-turn BFCL v4 item with ground truth (simple, multiple, parallel, live),
  tools converted to JSON Schema (:func:`hermes_vllm.schema.bfcl_to_json_schema`), the target
  calls built from the possible answers (the first acceptable value of each argument; items
  whose target does not validate against its tool's schema are skipped). A fixed hash of the
  item id puts one item in five into the held-out split (:func:`held_out_items`), never trained
  on; the same for every machine and every recipe.
- **Format**: the conversation rendered through Qwen 3's own chat template (tools in the system
  turn, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` replies, some with a
  ``<think>`` block naming the tool before the call), on Qwen 3's real tokenizer.
- **Model and training**: :mod:`hermes_vllm.testing.trained_model` ``Recipe`` (a Qwen 3
  architecture, a fixed seed and step count, never a time limit, so the same recipe gives
  byte-identical weights), cached in the artifact cache under the recipe's hash.

Usage: ``python -m hermes_vllm.testing.trained_model [--steps N] [OUT]``
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from hermes_vllm.testing.corpus import BFCL_FILES, as_openai_tool, registry_corpus

logger = logging.getLogger(__name__)

DATA_VERSION = 1
"""Bump when the examples built from the corpus change, so cached models are retrained."""
HELD_OUT_EVERY = 5
"""One item in this many is held out (by a hash of its id, not by its position in a file)."""


@dataclass(frozen=True)
class Call:
    """One target call: a tool name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Item:
    """One BFCL question with what it takes to ask it and to judge a reply.

    ``tools`` are OpenAI function tools (parameters in standard JSON Schema), ``messages`` the
    question's first (and only) turn as chat messages, ``possible_answers`` BFCL's ground truth
    (``[{name: {argument: [acceptable values]}}]``, ``""`` meaning the argument may be left out),
    ``target`` the calls training writes for it.
    """

    id: str
    category: str
    """The BFCL file it comes from, less ``BFCL_v4_`` and ``.json`` (``simple_python``, ``live_multiple``)."""
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    possible_answers: list[dict[str, dict[str, list[Any]]]]
    target: list[Call]

    @property
    def expected_names(self) -> list[str]:
        """The tool names of the expected calls, in order (the "right tool" of a reply)."""
        return [call.name for call in self.target]

    @property
    def schemas(self) -> dict[str, dict[str, Any]]:
        """Tool name -> its parameters' JSON Schema."""
        return {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}


def is_held_out(item_id: str) -> bool:
    """Whether the item with this id is in the held-out split: fixed by the id alone."""
    return int(hashlib.sha256(item_id.encode("utf-8")).hexdigest()[:8], 16) % HELD_OUT_EVERY == 0


def _first_value(values: list[Any]) -> tuple[bool, Any]:
    """(present, value): BFCL's ``""`` first means the argument is best left out."""
    return (False, None) if values[0] == "" else (True, values[0])


def target_calls(
    item_tools: list[dict[str, Any]], ground_truth: list[dict[str, dict[str, list[Any]]]]
) -> list[Call] | None:
    """The calls the possible answers describe, each argument its first acceptable value;
    ``None`` when one names no offered tool or does not validate against the tool's schema."""
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in item_tools}
    calls = []
    for answer in ground_truth:
        ((name, possible),) = answer.items()
        if name not in schemas or not all(isinstance(v, list) and v for v in possible.values()):
            return None
        arguments = {}
        for key, values in possible.items():
            present, value = _first_value(values)
            if present:
                arguments[key] = value
        try:
            jsonschema.validate(arguments, schemas[name])
        except (jsonschema.ValidationError, jsonschema.SchemaError):
            return None
        calls.append(Call(name, arguments))
    return calls


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@cache
def bfcl_items() -> tuple[Item, ...]:
    """Every renderable single-turn BFCL item of the pinned wheel, files in name order."""
    folder = registry_corpus() / "bfcl"
    items = []
    for name in BFCL_FILES:
        answers = {a["id"]: a["ground_truth"] for a in _json_lines(folder / "possible_answer" / name)}
        for question in _json_lines(folder / name):
            truth = answers.get(question["id"])
            if truth is None or len(question["question"]) != 1:
                continue
            tools = [as_openai_tool(f) for f in question["function"]]
            target = target_calls(tools, truth)
            if target is None:
                continue
            category = name.removeprefix("BFCL_v4_").removesuffix(".json")
            items.append(Item(question["id"], category, tools, question["question"][0], truth, target))
    return tuple(items)


def held_out_items() -> list[Item]:
    """The held-out split (about one item in :data:`HELD_OUT_EVERY`): never trained on."""
    return [item for item in bfcl_items() if is_held_out(item.id)]


def training_items() -> list[Item]:
    """The items the model is trained on: every renderable item not held out."""
    return [item for item in bfcl_items() if not is_held_out(item.id)]
