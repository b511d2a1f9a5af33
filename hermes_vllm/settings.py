"""Limits that keep a request's tools from taking a server down, in one place.

Every field can be overridden by an environment variable ``HERMES_VLLM_<FIELD>`` (upper case),
read once per process; see the "Limits" table in docs/architecture.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from functools import cache


@dataclass(frozen=True)
class Limits:
    """Bounds on what one request may ask the grammar compiler to do."""

    max_tools: int = 512
    """Tools in one request."""
    max_schema_bytes: int = 512 * 1024
    """Compact JSON size of one request's tool list."""
    max_schema_depth: int = 32
    """Nesting depth of a tool's parameter schema (objects/arrays/combinators)."""
    max_enum_values: int = 4096
    """Values in one ``enum``."""
    max_string_length_bound: int = 100_000
    """Largest ``minLength``/``maxLength`` compiled as a bound; larger bounds are refused."""
    max_name_length: int = 256
    """Characters in a tool name."""
    compile_timeout_s: float = 20.0
    """Wall time one grammar compile may take before the request fails."""
    compile_threads: int = 2
    """Background compile threads per engine process, and the threads one xgrammar compile uses."""
    cache_bytes: int = 128 * 1024 * 1024
    """Resident memory the compiled-grammar cache may hold (whole turn grammars: agents resend the
    same tools every turn); 0 turns it off."""
    xgrammar_cache_bytes: int = 256 * 1024 * 1024
    """Resident memory xgrammar's own cache may hold: token masks of rules that recur across tool
    sets (JSON strings, numbers, tags), which makes a new tool set's compile faster
    (docs/architecture.md, "Measurements behind the code").
    xgrammar counts about a third of what its cache keeps resident, so it is given a quarter; 0
    turns it off."""
    max_call_whitespace: int = 1
    """Whitespace characters allowed in each gap between two JSON tokens inside a call (and around
    the call's JSON). One covers compact and ``json.dumps`` style; xgrammar's masks inside calls
    cost more with more (docs/architecture.md, "Measurements behind the code")."""
    compose_min_tools: int = 64
    """Tool count from which the xgrammar engine composes a turn (a shared head grammar, the
    names checked outside xgrammar, each tool's grammar compiled when called) rather than
    compiling one grammar of every tool; 0 never composes (``grammar/engines/composed.py``)."""
    call_key_order: str = "declared"
    """Order of a call's top-level arguments: ``declared`` (the schema's ``properties`` order, what
    every engine writes) or ``any`` (every order, each a branch of an ``anyOf``, for closed tools
    of 2 to ``ANY_ORDER_ARGUMENTS`` properties; others keep the declared order). For measuring what
    a forced order costs a model (benchmarks/quality.py); ``any`` compiles larger grammars, and
    llguidance refuses its tools that have optional properties."""
    reasoning_budget: int = -1
    """Tokens the turn's reasoning and hidden spans may hold together (the open span's closing tag
    is then forced, and no span opens again), for requests that set no budget of their own
    (``thinking_token_budget``); -1: unbounded."""
    budget_margin: int = 4
    """Tokens kept beyond a call's shortest spelling by the reserve and by the steering that closes
    a call before ``max_tokens``: room for a forced token the engine refuses and a shorter one."""
    cut_policy: str = ""
    """What the budget does with a call ``max_tokens`` would cut: ``close`` (steer it to its
    shortest valid completion) or ``drop`` (let it be cut; the parser drops it); empty: ``close``
    for ``required`` and named tool choices, ``drop`` for ``auto``."""
    grammar_drafts: int = 1
    """Under speculative decoding, offer the tokens a row's grammar forces next as its drafts
    (``processor/forced_drafts.py``); 0: rows keep the proposer's drafts."""


def _coerce(raw: str, kind: type) -> object:
    try:
        return kind(raw)
    except ValueError as err:
        raise ValueError(f"cannot read {raw!r} as {kind.__name__}") from err


@cache
def get_limits() -> Limits:
    """The process-wide limits: defaults overridden by ``HERMES_VLLM_*`` environment variables."""
    overrides: dict[str, object] = {}
    for f in fields(Limits):
        env = f"HERMES_VLLM_{f.name.upper()}"
        if env in os.environ:
            kind = int if f.type in (int, "int") else str if f.type in (str, "str") else float
            try:
                overrides[f.name] = _coerce(os.environ[env], kind)
            except ValueError as err:
                raise ValueError(f"{env}: {err}") from err
    return Limits(**overrides)  # type: ignore[arg-type]
