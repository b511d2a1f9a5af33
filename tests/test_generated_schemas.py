"""Schemas clients generate (issue 28, items 3 and 4): pydantic models, their ``allOf`` form, the
openai SDK's strict form, LangChain's ``convert_to_openai_tool`` and MCP servers' ``list_tools``
(our own, ``mcp-server-time``, ``mcp-server-fetch``; :mod:`support.generated_schemas`).

The call completer builds a shortest call for each that the client's own model accepts; each
compiles on every engine but for the keywords an engine refuses by name; a seeded worst-case
sweep (every sampler, ``required`` and named, from the reserve up, one tool and a 66-tool set
that the composed matcher serves) gets every owed call, and the client's model accepts each.
``benchmarks/worstcase.py --generated`` runs the full sweep.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from support.generated_schemas import FORMS, MODELS, GeneratedTool, generated_tools

from hermes_vllm import constraint_args
from hermes_vllm.budget import CallCompleter
from hermes_vllm.dialect import get_dialect
from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.grammar.engines.composed import ComposedGrammar
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.schema import normalize_tool
from hermes_vllm.testing.adversary import SAMPLERS, Scenario, run

HERMES = get_dialect("hermes")
TOOLS = generated_tools()
REFUSES: dict[str, dict[str, tuple[str, ...]]] = {
    "llguidance": {"PlanMeeting": ("multipleOf",)},
    "outlines": {
        "CreateTicket": ("maxLength",),
        "Schedule": ("maximum", "minimum", "maxLength"),
        "PlanMeeting": ("multipleOf",),
        "Tally": ("pattern",),
        "Lexicon": ("maxLength",),
        "plan_route": ("maximum", "minimum"),
        "book_tableArguments": ("maximum", "minimum"),
        "notify_stopsArguments": ("maxLength", "maximum", "minimum"),
        "fetchArguments": ("maximum", "minimum"),
    },
}
"""What an engine refuses in the corpus, by name: its documented limits (an unbounded integer
``multipleOf`` is xgrammar's alone; outlines-core has no string lengths, number bounds or patterns,
and a string holding JSON is one)."""


def _arguments(call: str) -> Any:
    return json.loads(call[len("<tool_call>") : -len("</tool_call>")])["arguments"]


@pytest.mark.parametrize("generated", TOOLS, ids=lambda g: g.id)
def test_the_shortest_call_is_one_the_client_accepts(generated: GeneratedTool) -> None:
    spec = normalize_tool(generated.tool)
    completer = CallCompleter(HERMES, [(spec.name, spec.parameters)])
    shortest = completer.shortest_call()
    assert shortest is not None, completer.unknown()
    assert generated.accepts(_arguments(shortest)) is None, shortest


@pytest.fixture(scope="module")
def compilers(tokenizer: Any) -> dict[str, ToolGrammarCompiler]:
    return {
        e: ToolGrammarCompiler(tokenizer, engine=e) for e in ("xgrammar", "llguidance", "outlines", "auto")
    }


@pytest.mark.parametrize("engine", ("xgrammar", "llguidance", "outlines", "auto"))
def test_every_engine_compiles_the_corpus(compilers: dict[str, ToolGrammarCompiler], engine: str) -> None:
    """Discriminated unions (a ``oneOf`` of ``$ref`` s), pydantic's tuples and sets of enum members
    compile everywhere; an engine refuses only its documented keywords, by name."""
    for generated in TOOLS:
        refused = REFUSES.get(engine, {}).get(generated.model.__name__, ())
        if refused:
            with pytest.raises(ValueError, match="|".join(refused)):
                compilers[engine].compile([generated.tool])
        else:
            compilers[engine].compile([generated.tool])


def _played(
    core: ConstraintCore, tokenizer: Any, tools: list[GeneratedTool], choice: str, extra: int, sampler: str
) -> None:
    """One seeded play; the owed call is there and its own tool's model accepts every call."""
    offered = [g.tool for g in tools]
    named = "required" if choice == "required" else {"type": "function", "function": {"name": choice}}
    state = core.admit(constraint_args(offered, named), [], max_tokens=4096)
    assert state is not None and state.budget is not None
    outcome = run(
        core, tokenizer, Scenario(offered, choice, state.budget.reserve + extra), sampler, seed=extra
    )
    assert outcome.kept(None), (sampler, choice, extra, outcome)
    assert len(outcome.payloads) == outcome.calls, outcome
    by_name = {g.name: g for g in tools}
    for payload in outcome.payloads:
        assert by_name[payload["name"]].accepts(payload["arguments"]) is None, (sampler, outcome.text)


def test_seeded_worst_case_over_the_corpus(tokenizer: Any) -> None:
    """Each tool alone on the server's engine, every sampler, ``required`` and named in turn, at
    the reserve and up to 9 tokens above it."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="auto")
    for k, generated in enumerate(TOOLS):
        for j, sampler in enumerate(SAMPLERS):
            choice = "required" if (k + j) % 2 else generated.name
            _played(core, tokenizer, [generated], choice, (k * 5 + j) % 10, sampler)


def test_seeded_worst_case_at_agent_scale(tokenizer: Any) -> None:
    """66 tools (the corpus twice, under two names): the composed matcher serves the
    turn (xgrammar), and each sampler still gets a call the named tool's model accepts."""
    tools = [*TOOLS, *generated_tools("_b")][:66]
    assert len(tools) == 66 == len({g.name for g in tools})
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    turn = core.compiler.prepare([g.tool for g in tools], "required").spec
    assert isinstance(core.compiler.engine.compile(turn), ComposedGrammar)
    for k, target in enumerate(tools[:: len(FORMS) * len(MODELS) // 6]):
        _played(core, tokenizer, tools, target.name, k % 4, SAMPLERS[k % len(SAMPLERS)])
    for sampler in SAMPLERS:
        _played(core, tokenizer, tools, "required", 0, sampler)


@pytest.mark.parametrize("exponent", ["9" * 12, "-" + "9" * 12])
def test_a_long_exponent_is_completed_at_once(exponent: str) -> None:
    """The ``longest`` sampler on DrawShape's floats writes an exponent's digits for as long as it
    may; building ``10 ** exponent`` to check the value took minutes from 8 digits on (the sweep
    stalled in one step). An unbounded number needs no value; a bounded one gives up instead."""
    unbounded = normalize_tool(next(g for g in TOOLS if g.id == "DrawShape-pydantic").tool)
    bounded = normalize_tool(
        {
            "type": "function",
            "function": {
                "name": "b",
                "parameters": {
                    "type": "object",
                    "properties": {"x": {"type": "number", "maximum": 3}},
                    "required": ["x"],
                },
            },
        }
    )
    began = time.perf_counter()
    done = CallCompleter(HERMES, [(unbounded.name, unbounded.parameters)]).complete(
        '<tool_call>{"name":"drawshape_pydantic","arguments":{"corner":{"x":1e' + exponent
    )
    assert done == ',"y":0},"size":[0,0]}}</tool_call>'
    assert (
        CallCompleter(HERMES, [(bounded.name, bounded.parameters)]).complete(
            '<tool_call>{"name":"b","arguments":{"x":1e' + exponent
        )
        is None
    )
    assert time.perf_counter() - began < 1.0
