"""What a request carries to ask for tool-call constraints: ``SamplingParams.extra_args``.

The tool parser fills it from ``vllm_xargs`` on the server; offline users call
:func:`sampling_options` (or :func:`constraint_args` for ``extra_args`` alone). ``vllm_xargs``
only carries str/int/float/list values, so the whole constraint travels as one JSON string under
one key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hermes_vllm.dialect import DEFAULT_DIALECT, Dialect, available_dialects, get_dialect
from hermes_vllm.memo import memoize_small
from hermes_vllm.metrics import Refusal
from hermes_vllm.schema import Coverage
from hermes_vllm.settings import get_limits

ARGS_KEY = "hermes_vllm"
FORMAT_VERSION = 1
BUDGET_KEY = "hermes_vllm_reasoning_budget"
"""Tokens all the turn's reasoning/hidden spans together may hold (``vllm_xargs``: the tool parser
rewrites ``ARGS_KEY``, so the budget travels under its own key); vLLM's ``thinking_token_budget``
wins."""
CUT_KEY = "hermes_vllm_cut_policy"
"""``close`` or ``drop``: what ``max_tokens`` does to a begun call (see ``Limits.cut_policy``)."""
CUT_POLICIES = ("close", "drop")


@dataclass(frozen=True)
class BudgetOptions:
    """A request's own budget options from ``extra_args`` (``None``: the server's default)."""

    reasoning_budget: int | None = None
    cut_policy: str | None = None

    def turn_budget(self, thinking: int | None) -> int | None:
        """Tokens the turn's reasoning and hidden spans may hold together; ``None``: unbounded.

        ``thinking`` is vLLM's ``thinking_token_budget``: it wins over the ``vllm_xargs`` key,
        which wins over the server's ``HERMES_VLLM_REASONING_BUDGET``.
        """
        if thinking is not None:
            return thinking
        if self.reasoning_budget is not None:
            return self.reasoning_budget
        default = get_limits().reasoning_budget
        return default if default >= 0 else None

    def closes(self, required: bool) -> bool:
        """Whether a call ``max_tokens`` would cut is closed (policy ``close``) rather than left to
        be dropped: the request's policy, else the server's, else ``close`` where a call is owed."""
        policy = self.cut_policy or get_limits().cut_policy or ("close" if required else "drop")
        return policy == "close"


def _parse_budget(args: Mapping[str, Any]) -> BudgetOptions:
    """The budget keys of ``extra_args``; ``ValueError`` when malformed (HTTP 400)."""
    budget = args.get(BUDGET_KEY)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise ValueError(f"{BUDGET_KEY}: expected a non-negative integer, got {budget!r}")
    policy = args.get(CUT_KEY)
    if policy is not None and policy not in CUT_POLICIES:
        raise ValueError(f"{CUT_KEY}: expected one of {', '.join(CUT_POLICIES)}, got {policy!r}")
    return BudgetOptions(budget, policy)


@dataclass(frozen=True)
class ConstraintRequest:
    """A request's tool constraint, decoded from ``extra_args``; equal and hashed by ``raw``."""

    tools: tuple[Any, ...] = field(compare=False)
    tool_choice: Any = field(compare=False)
    parallel_tool_calls: bool = field(compare=False)
    dialect: str = field(compare=False)
    coverage: Coverage = field(compare=False)
    raw: str = ""
    """The JSON it came from: equal strings mean equal constraints (a cheap cache key)."""
    budget: BudgetOptions = field(default=BudgetOptions(), compare=False)
    """The request's own budget keys (they travel beside the constraint's JSON, so two requests
    with the same tools share every cache whatever their budgets)."""
    answer: Mapping[str, Any] | None = field(default=None, compare=False)
    """The final answer's JSON schema (the request's ``response_format``), served by the turn
    grammar beside the calls; ``None``: no answer schema."""


def constraint_args(
    tools: Sequence[Any],
    tool_choice: Any = "auto",
    parallel_tool_calls: bool = True,
    dialect: str = DEFAULT_DIALECT,
    coverage: Coverage = "strict",
    *,
    reasoning_budget: int | None = None,
    cut_policy: str | None = None,
    answer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``extra_args`` that make the hermes-vllm logits processor constrain this request.

    Pass the result as ``SamplingParams(extra_args=...)`` offline, or as ``vllm_xargs`` over HTTP.
    ``reasoning_budget``: tokens the turn's reasoning/hidden spans may hold together; once spent,
    the open span's closing tag is forced and no span opens again (vLLM's own
    ``thinking_token_budget``, where set, takes precedence). ``cut_policy``:
    ``close`` or ``drop`` for a call ``max_tokens`` would cut (default: ``close`` under
    ``required`` / named, ``drop`` under ``auto``). ``answer``: the JSON schema of the final
    answer (a ``response_format``'s): under ``auto`` the turn is then calls or that answer, never
    free text; under ``none`` the answer only; a required call leaves it unused.
    """
    payload: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "tools": [t.model_dump(exclude_none=True) if hasattr(t, "model_dump") else t for t in tools],
        "tool_choice": tool_choice.model_dump(exclude_none=True)
        if hasattr(tool_choice, "model_dump")
        else tool_choice,
        "parallel_tool_calls": bool(parallel_tool_calls),
        "dialect": dialect,
        "coverage": coverage,
    }
    if answer is not None:
        payload["answer"] = answer
    args: dict[str, Any] = {ARGS_KEY: json.dumps(payload, ensure_ascii=False, separators=(",", ":"))}
    if reasoning_budget is not None:
        args[BUDGET_KEY] = reasoning_budget
    if cut_policy is not None:
        args[CUT_KEY] = cut_policy
    return args


def special_tags(tokenizer: Any, *dialects: str | Dialect) -> frozenset[str]:
    """The dialects' parsed tags (call, reasoning, hidden) that ``tokenizer`` has as special tokens
    (the default dialect's when none is named).

    vLLM's default ``skip_special_tokens=True`` drops those from the text, so no parser finds
    the spans they open (Hermes 3 has its tags on special slots; Hermes 2 Pro and Qwen do not).
    """
    tags = frozenset().union(*(get_dialect(d).parsed_tags for d in dialects or (DEFAULT_DIALECT,)))
    return tags & frozenset(tokenizer.all_special_tokens)


def check_special_tags(request: ConstraintRequest, skip_special: bool, special: frozenset[str]) -> None:
    """Refuse a request whose tags ``skip_special`` (its ``skip_special_tokens``) would strip from
    the text: no call could be read.

    ``special`` is what :func:`special_tags` found on the engine's tokenizer.
    """
    stripped = get_dialect(request.dialect).parsed_tags & special if skip_special else frozenset()
    if stripped:
        raise Refusal(
            "combination",
            f"this model's tokenizer has {', '.join(sorted(stripped))} as special tokens, which "
            "skip_special_tokens=True strips from the text, so no call could be read: set "
            "SamplingParams(skip_special_tokens=False), e.g. with hermes_vllm.sampling_options(...)",
        )


def sampling_options(
    tokenizer: Any,
    tools: Sequence[Any],
    tool_choice: Any = "auto",
    parallel_tool_calls: bool = True,
    dialect: str = DEFAULT_DIALECT,
    coverage: Coverage = "strict",
) -> dict[str, Any]:
    """Keyword arguments for ``SamplingParams`` that constrain an offline request's tool calls
    and keep its tags in the text: ``SamplingParams(max_tokens=..., **sampling_options(...))``.

    ``extra_args`` as :func:`constraint_args` makes them, plus ``skip_special_tokens=False``
    when a tag is a special token of ``tokenizer`` (the server's tool parser does the same).
    """
    options: dict[str, Any] = {
        "extra_args": constraint_args(tools, tool_choice, parallel_tool_calls, dialect, coverage)
    }
    if special_tags(tokenizer, dialect):
        options["skip_special_tokens"] = False
    return options


def has_constraint(extra_args: Mapping[str, Any] | None) -> bool:
    """Cheap check used on every request: does it ask for constraints at all?"""
    return bool(extra_args) and ARGS_KEY in extra_args  # type: ignore[operator]


@memoize_small(len)
def decode_constraint(raw: str) -> ConstraintRequest:
    """The request that a constraint's JSON text (``constraint_args``' value) describes.

    Raises ``ValueError`` naming the field that is malformed.
    """
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"{ARGS_KEY}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{ARGS_KEY}: expected a JSON object, got {type(data).__name__}")
    if data.get("v") != FORMAT_VERSION:
        raise ValueError(
            f"{ARGS_KEY}: unsupported format version {data.get('v')!r} (expected {FORMAT_VERSION})"
        )
    tools = data.get("tools")
    if not isinstance(tools, list):
        raise ValueError(f"{ARGS_KEY}.tools: expected a list of tool definitions")
    dialect = data.get("dialect", DEFAULT_DIALECT)
    if dialect not in available_dialects():
        raise ValueError(
            f"{ARGS_KEY}.dialect: unknown dialect {dialect!r}; "
            f"choose one of {', '.join(available_dialects())}"
        )
    parallel = data.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ValueError(f"{ARGS_KEY}.parallel_tool_calls: expected true or false, got {parallel!r}")
    coverage = data.get("coverage", "strict")
    if coverage not in ("strict", "lenient"):
        raise ValueError(f"{ARGS_KEY}.coverage: expected 'strict' or 'lenient', got {coverage!r}")
    answer = data.get("answer")
    if answer is not None and not isinstance(answer, dict):
        raise ValueError(f"{ARGS_KEY}.answer: expected a JSON schema object, got {type(answer).__name__}")
    return ConstraintRequest(
        tuple(tools), data.get("tool_choice", "auto"), parallel, dialect, coverage, raw, answer=answer
    )


def parse_constraint(extra_args: Mapping[str, Any] | None) -> ConstraintRequest | None:
    """The request's constraint with its budget options, decoded once from ``extra_args``;
    ``None`` when it has none; ``ValueError`` (HTTP 400) naming the malformed key."""
    if not has_constraint(extra_args):
        return None
    assert extra_args is not None
    raw = extra_args[ARGS_KEY]
    if not isinstance(raw, str):
        raise ValueError(f"{ARGS_KEY}: expected a JSON string, got {type(raw).__name__}")
    return replace(decode_constraint(raw), budget=_parse_budget(extra_args))
