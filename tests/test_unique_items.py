"""``uniqueItems`` (issue 28, item 2). Over a small ``enum`` (pydantic's ``set[Enum]``,
``set[Literal[...]]``): spelled out as the arrays of distinct members, on every engine. Over plain
strings, integers and numbers (``set[str]``, ``frozenset[int]``, ``set[float]``): kept by the
processor, which refuses a token closing an item equal to an earlier one
(:mod:`hermes_vllm.grammar.unique`), with the budget's completion writing distinct items."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Literal

import numpy as np
import pytest
import torch
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field
from support.worst_case import worst_case_arguments

from hermes_vllm import constraint_args
from hermes_vllm.budget import CallCompleter
from hermes_vllm.dialect import get_dialect
from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.grammar.unique import _pieces
from hermes_vllm.processor.core import ConstraintCore, validate_request
from hermes_vllm.schema import normalize_tool
from hermes_vllm.spans import split_spans


class Channel(StrEnum):
    mail = "mail"
    sms = "sms"
    push = "push"


class Notify(BaseModel):
    via: set[Channel]
    days: frozenset[Literal["mon", "tue"]] = frozenset()


NOTIFY = {"type": "function", "function": {"name": "notify", "parameters": Notify.model_json_schema()}}
ENGINES = ("xgrammar", "llguidance", "outlines", "auto")


def call(arguments: dict[str, Any]) -> str:
    return f'<tool_call>{{"name": "notify", "arguments": {json.dumps(arguments)}}}</tool_call>'


def test_a_set_of_enum_members_is_spelled_out() -> None:
    via = normalize_tool(NOTIFY).parameters["properties"]["via"]
    assert "uniqueItems" not in json.dumps(via)
    assert len(via["anyOf"]) == 1 + 3 + 6 + 6


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_admits_distinct_members_only(tokenizer: Any, engine: str) -> None:
    grammar = ToolGrammarCompiler(tokenizer, engine=engine).compile([NOTIFY])
    for via in ([], ["sms"], ["push", "mail"], ["sms", "mail", "push"]):
        assert grammar.matcher().accepts_text(call({"via": via, "days": ["tue", "mon"]})), via
    for via in (["sms", "sms"], ["mail", "push", "mail"], ["fax"]):
        assert not grammar.matcher().accepts_text(call({"via": via})), via
    assert not grammar.matcher().accepts_text(call({"via": [], "days": ["mon", "mon"]}))


class Tag(BaseModel):
    """Free-form sets: no engine's grammar can say "distinct" here."""

    tags: Annotated[set[str], Field(min_length=2)]
    ids: frozenset[int] = frozenset()
    scores: set[float] | None = None


TAG = {"type": "function", "function": {"name": "tag", "parameters": Tag.model_json_schema()}}
TAG_CHECK = Draft202012Validator(Tag.model_json_schema())


def tag_call(arguments: dict[str, Any]) -> str:
    return f'<tool_call>{{"name": "tag", "arguments": {json.dumps(arguments)}}}</tool_call>'


@pytest.mark.parametrize("engine", ENGINES)
def test_free_sets_admit_distinct_items_only(tokenizer: Any, engine: str) -> None:
    """The matcher (the processor's, and the public one) refuses an item equal to an earlier one,
    compared as a value: ``"\u0061"`` is ``"a"``, ``1.0`` is ``1``."""
    grammar = ToolGrammarCompiler(tokenizer, engine=engine).compile([TAG])
    for arguments in (
        {"tags": ["a", "b"]},
        {"tags": ["ab", "a", "abc"], "ids": [0, 1, 10, -1]},
        {"tags": ["", " "], "scores": [1, 1.5, 0.1, 10]},
    ):
        assert grammar.matcher().accepts_text(tag_call(arguments)), arguments
    for arguments in (
        {"tags": ["a", "a"]},
        {"tags": ["a", "b"], "ids": [1, 1]},
        {"tags": ["a", "b"], "ids": [0, 2, 0]},
        {"tags": ["a", "b"], "scores": [1, 1.0]},
    ):
        assert not grammar.matcher().accepts_text(tag_call(arguments)), arguments
    escaped = '<tool_call>{"name": "tag", "arguments": {"tags": ["a", "\\u0061"]}}</tool_call>'
    assert not grammar.matcher().accepts_text(escaped)


def _masked_after(core: ConstraintCore, text: str) -> tuple[set[str], set[str]]:
    """Feed ``text`` to a ``required`` row token by token; the pieces the next mask allows and
    refuses among a few probes."""
    tokenizer = core.compiler.vocab.tokenizer
    state = core.admit(constraint_args([TAG], "required"), [], max_tokens=1000)
    assert state is not None
    logits = torch.zeros((1, core.vocab_size))
    core.step(logits, [(0, state, [])])
    for token in tokenizer.encode(text, add_special_tokens=False):
        logits = torch.zeros((1, core.vocab_size))
        core.step(logits, [(0, state, [token])])
        assert state.failed is None, text
    latin1 = core.compiler.vocab.latin1
    probes = {'"', "]", ",", "0", "b"}
    ids = {latin1.index(p): p for p in probes if p in latin1}
    allowed = {p for t, p in ids.items() if torch.isfinite(logits[0, t])}
    return allowed, set(ids.values()) - allowed


@pytest.mark.parametrize("engine", ("auto", "xgrammar", "llguidance"))
def test_the_processor_refuses_the_token_closing_a_repeat(tokenizer: Any, engine: str) -> None:
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine=engine)
    head = '<tool_call>{"name": "tag", "arguments": {"tags": ["a", "'
    allowed, refused = _masked_after(core, head + "a")
    assert '"' in refused and "b" in allowed
    allowed, _ = _masked_after(core, head + "b")
    assert '"' in allowed
    allowed, refused = _masked_after(core, head + 'b"], "ids": [7, 0, 7')
    assert {",", "]"} <= refused and "0" in allowed
    _, refused = _masked_after(core, head + 'b"], "ids": [0, ')
    assert "0" in refused  # an integer 0 can only close: it is refused as it is written


class _Repeater:
    """A model that tries to repeat: it writes its script while the mask lets it, then the
    allowed piece that closes an item soonest (a quote, a separator, a digit)."""

    SCRIPT = (
        '<tool_call>{"name": "tag", "arguments": {"tags": ["a", "a", "", "", "a"], '
        '"ids": [0, 0, 1, 1, 0], "scores": [1, 1.0, 1, 2, 2.0]}}</tool_call>'
    )
    PREFERRED = ('"', "]", ",", "0", "1", " ")

    def pick(self, text: str, allowed: np.ndarray, latin1: list[str]) -> int:
        best = None
        for token in allowed.tolist():
            piece = latin1[token]
            if (
                piece
                and self.SCRIPT.startswith(text + piece)
                and (best is None or len(piece) > len(latin1[best]))
            ):
                best = token
        if best is not None:
            return int(best)
        rank = {p: k for k, p in enumerate(self.PREFERRED)}
        return int(min(allowed.tolist(), key=lambda t: (rank.get(latin1[t], len(rank)), len(latin1[t]), t)))


@pytest.mark.parametrize("engine", ("auto", "xgrammar", "llguidance", "outlines"))
def test_a_model_that_repeats_gets_distinct_items(tokenizer: Any, engine: str) -> None:
    """Every budget from the reserve up: the call is whole and jsonschema (``uniqueItems`` as
    sent) accepts it; pydantic would take a repeat silently (a set drops it), jsonschema not."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine=engine)
    latin1 = core.compiler.vocab.latin1
    reserve = None
    for extra in (0, 7, 30, 200):
        state = core.admit(constraint_args([TAG], "required"), [], max_tokens=1000)
        assert state is not None and state.budget is not None
        reserve = state.budget.reserve
        state = core.admit(constraint_args([TAG], "required"), [], max_tokens=reserve + extra)
        assert state is not None
        text, new = "", []
        for _ in range(reserve + extra):
            logits = torch.zeros((1, core.vocab_size))
            core.step(logits, [(0, state, new)])
            assert state.failed is None, (extra, text)
            token = _Repeater().pick(text, np.flatnonzero(torch.isfinite(logits[0]).numpy()), latin1)
            if token in state.stop_ids:
                break
            text += latin1[token]
            new = [token]
        decoded = text.encode("latin-1").decode("utf-8", errors="replace")
        calls = [s for s in split_spans(decoded, get_dialect("hermes"), strict=True) if s.kind == "call"]
        assert calls and all(s.closed for s in calls), (extra, decoded)
        for span in calls:
            arguments = json.loads(span.body)["arguments"]
            TAG_CHECK.validate(arguments)
            Tag.model_validate(arguments)


def test_what_the_processor_cannot_keep_is_still_refused_by_name(tokenizer: Any) -> None:
    """Items it cannot always write on (a bounded string, an object) and an answer's sets."""
    for items in ({"type": "string", "maxLength": 3}, {"type": "object"}):
        schema = {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": items, "uniqueItems": True}},
        }
        tags = {"type": "function", "function": {"name": "tag", "parameters": schema}}
        with pytest.raises(ValueError, match="uniqueItems' at parameters/properties/tags"):
            ToolGrammarCompiler(tokenizer, engine="auto").compile([tags])
    with pytest.raises(ValueError, match="uniqueItems' at parameters/properties/tags cannot be enforced"):
        validate_request(constraint_args([NOTIFY], "auto", answer=Tag.model_json_schema()), "auto")


def test_worst_case_calls_hold_distinct_members(tokenizer: Any) -> None:
    """Every sampler, ``required`` and named, from the reserve up: jsonschema (``uniqueItems``
    as sent) and ``Notify.model_validate`` accept each call (the tool was refused before)."""
    validator = Draft202012Validator(Notify.model_json_schema())
    for arguments in worst_case_arguments(
        tokenizer, NOTIFY, [("required", 0), ("notify", 6), ("required", 40)]
    ):
        validator.validate(arguments)
        Notify.model_validate(arguments)


def test_the_completer_writes_distinct_items() -> None:
    """The shortest call and a begun item's completion are distinct from what is written: the
    processor would refuse a repeat the budget forced, and the call would be cut."""
    spec = normalize_tool(TAG)
    completer = CallCompleter(get_dialect("hermes"), [(spec.name, spec.parameters)])
    assert completer.shortest_call() == '<tool_call>{"name":"tag","arguments":{"tags":["","a"]}}</tool_call>'
    head = '<tool_call>{"name": "tag", "arguments": {"tags": ["a", '
    assert completer.complete(head + '"a') == 'a"]}}</tool_call>'  # "aa"
    assert completer.complete(head + '"') == '"]}}</tool_call>'
    assert completer.complete(head + '"b"], "ids": [1, 1') == "0]}}</tool_call>"
    assert completer.complete(head + '"b"], "scores": [1.0, 1.') == "1]}}</tool_call>"
    assert completer.complete(head + '"a"') is None  # a repeat written: no valid reading


def test_the_guard_follows_rollbacks(tokenizer: Any) -> None:
    """Speculative decoding rolls the matcher back: the items the guard read go back with it."""
    grammar = ToolGrammarCompiler(tokenizer, engine="xgrammar").compile([TAG], "required")
    latin1 = grammar.vocab.latin1
    a, quote = latin1.index("a"), latin1.index('"')
    head = '<tool_call>{"name": "tag", "arguments": {"tags": ['
    matcher = grammar.matcher()
    assert all(matcher.accept_token(t) for t in tokenizer.encode(head + '"a", "', add_special_tokens=False))
    assert matcher.accept_token(a)
    assert not matcher.accept_token(quote)  # "a" again
    matcher.rollback(1)
    assert matcher.accept_token(quote)  # "" is new
    matcher = grammar.matcher()
    assert all(matcher.accept_token(t) for t in tokenizer.encode(head + '"', add_special_tokens=False))
    assert matcher.accept_token(a) and matcher.accept_token(quote)
    matcher.rollback(2)  # the first item is unwritten: "a" may be written again
    assert matcher.accept_token(a) and matcher.accept_token(quote)


def test_cores_on_one_tokenizer_share_the_guards_token_tables(tokenizer: Any) -> None:
    """The tables a guard reads (tokens that may close an item) are built once per tokenizer: the
    cores of one tokenizer share its vocabulary, which keeps them (each core once built its own
    vocabulary object, and a table kept per object stayed alive with each: a test process's
    hundreds of cores kept hundreds of 131k-token tables)."""
    first, second = (ToolGrammarCompiler(tokenizer).vocab for _ in range(2))
    assert first is second and first.latin1 is second.latin1
    assert _pieces(first) is _pieces(second)
