"""A worst-case model for the token budgets: samplers that only ever pick what the mask allows.

The budgets promise that a ``required`` / named reply always holds its call, complete and valid,
whatever the model writes, as long as it writes only what the mask allows. A random model rarely
finds the corners; these samplers look for them on purpose. Each drives a
:class:`~hermes_vllm.processor.core.ConstraintCore` one token at a time (no vLLM engine: the core
is what masks, so a run takes milliseconds), and each picks among the tokens the step's mask
allows:

- ``random``: uniformly (seeded);
- ``longest``: opens the call at once, then writes the token after which the call's shortest
  completion is longest, in this vocabulary's tokens;
- ``late``: opens the call at once, then never closes what it may leave open: opens optional
  properties and items where it may, keeps strings and numbers going, takes the longest token;
- ``lead_bytes``: opens a reasoning span where allowed, then writes lone UTF-8 lead bytes
  wherever allowed (characters split at every step);
- ``reopen``: opens a reasoning span whenever allowed and never closes one itself.

Each reply is played through a *driver*: the core itself (:class:`CoreDriver`, what the sweep
uses), or one of the two runner adapters fed as vLLM feeds them (:class:`V1Driver`: a
``BatchUpdate`` and the output list it holds by reference; :class:`V2Driver`: the V2 runner's
slot buffers of :mod:`hermes_vllm.testing.v2_runner`), so the adapters' bookkeeping (tokens
read back, rows admitted from ``SamplingParams``) is under the same worst case.

Except for ``random``, no sampler ends the reply (a stop token) or closes a reasoning span while
anything else is allowed: the budget must do it. With ``vllm_thinking`` the run also plays vLLM's
own thinking budget, which forces the closing tag over any mask once a span holds the budget's
tokens (a token the grammar refuses then fails the row, as it would in vLLM).

:func:`run` reports per reply whether the owed call arrived complete and schema-valid, each
reasoning span's length against its budget, and whether the row failed.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import jsonschema
import numpy as np
import torch

from hermes_vllm import constraint_args
from hermes_vllm.budget import CallCompleter
from hermes_vllm.dialect import Dialect
from hermes_vllm.latin1 import as_latin1, as_text
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.processor.row import RowState
from hermes_vllm.schema import normalize_tools
from hermes_vllm.spans import Tail, read_tail, split_spans
from hermes_vllm.vocabulary import served_vocabulary

if TYPE_CHECKING:
    from vllm.config import VllmConfig

SAMPLERS = ("random", "longest", "late", "lead_bytes", "reopen")
"""The samplers :func:`run` knows, by name."""
_CANDIDATES = 24
"""Allowed tokens ``longest`` weighs at a step (a random draw, the structural ones always)."""
_CLOSERS = frozenset('"}]')
_OPENERS = frozenset([",", ',"', '"', "{", '{"', "[", "-", "0", "1", "9", "\\"])
"""Pieces ``longest`` always weighs where allowed: what opens more JSON."""


@dataclass(frozen=True)
class Scenario:
    """One request as the adversary plays it."""

    tools: Sequence[dict[str, Any]]
    """OpenAI-style tools (``{"type": "function", "function": {...}}``) or bare functions."""
    choice: Any = "required"
    """``"required"``, ``"auto"``, or a tool's name (named)."""
    max_tokens: int = 200
    stop: tuple[str, ...] = ()
    thinking_budget: int | None = None
    """vLLM's ``thinking_token_budget``."""
    vllm_thinking: bool = False
    """Play vLLM's own thinking budget too (it forces the closing tag over any mask)."""
    answer: Mapping[str, Any] | None = None
    """The final answer's JSON schema (a ``response_format`` beside the tools): under ``auto``
    and ``none`` the reply owes a call or that answer."""


@dataclass
class Outcome:
    """What one reply held."""

    sampler: str
    text: str
    """The reply as decoded (a stop string and what follows cut off, as vLLM returns it)."""
    tokens: int
    owed: bool
    """The turn owed a call (``required`` / named), or a call or its answer."""
    answered: bool = False
    """The reply's content (outside spans and calls) is a whole answer valid for its schema."""
    calls: int = 0
    """Complete calls, each valid for its tool."""
    payloads: list[dict[str, Any]] = field(default_factory=list)
    """The parsed JSON (``{"name": ..., "arguments": ...}``) of each call counted in
    :attr:`calls`, in the reply's order. The judge parses every call to check it against its
    tool's schema; it keeps what it parsed so that a test checking the calls further (the
    client's own pydantic model, a format checker) reads them here instead of splitting
    :attr:`text` into spans and parsing each call again. Not written by the worst-case
    benchmark's rows (they name their fields)."""
    invalid: list[str] = field(default_factory=list)
    """Why a closed call was not valid (or not the named tool)."""
    cut: bool = False
    """A call was begun and never closed."""
    spans: list[int] = field(default_factory=list)
    """Tokens inside each reasoning span, counted as vLLM counts them."""
    failed: str | None = None
    """The row failed: the engine refused a token it was given."""
    ended_by: str = "max_tokens"
    window_steps: int = 0
    """Steps taken with the row inside its budget's window (what is left within its alert)."""
    window_seconds: float = 0.0
    """Time the core spent on those steps (advance and mask, one row)."""
    other_steps: int = 0
    other_seconds: float = 0.0

    def kept(self, budget: int | None) -> bool:
        """The budgets' promise held: the owed call is there, every call is valid, no span ran
        over ``budget``, the row did not fail, and (owed) no call was left cut."""
        spans_ok = budget is None or all(n <= budget for n in self.spans)
        owed_ok = not self.owed or (self.calls > 0 and not self.cut) or self.answered
        return owed_ok and spans_ok and not self.invalid and self.failed is None


@dataclass(frozen=True)
class _Marks:
    """Per-token facts the samplers rank by, one array each over the vocabulary (built once per
    core and dialect: the samplers' per-step work is array lookups, not passes over the vocabulary)."""

    tags: np.ndarray
    """Holds a tag of the dialect (opening or closing)."""
    score: np.ndarray
    """``late``'s preference: a comma counts 2, holding no closer 1."""
    length: np.ndarray
    lead: np.ndarray
    """Ends with a UTF-8 lead byte."""
    structural: np.ndarray
    """Holds JSON punctuation or a digit: what ``longest`` weighs first."""
    opener: np.ndarray
    """Is one of :data:`_OPENERS`: weighed by ``longest`` wherever allowed."""
    call_begin: np.ndarray
    """Is the whole call tag."""
    reasoning_begin: np.ndarray
    """Is a whole reasoning tag."""
    reasoning_end: int
    """The token of the first reasoning span's closing tag (-1: none)."""


def _marks_for(core: ConstraintCore, dialect: Dialect) -> _Marks:
    """The samplers' marks of ``dialect`` in the core's vocabulary: a table it keeps."""
    vocab = core.compiler.vocab
    return vocab.table(f"adversary marks {dialect.name}", lambda: _read_marks(vocab.latin1, dialect))


def _read_marks(latin1: list[str], dialect: Dialect) -> _Marks:
    tags = [p.begin for p in (dialect.tool_call, *dialect.free_spans)] + [p.end for p in dialect.free_spans]
    opens = [p.begin for p in dialect.reasoning]
    end = dialect.reasoning[0].end if dialect.reasoning else None
    return _Marks(
        np.array([any(g in p for g in tags) for p in latin1]),
        np.array([("," in p) * 2 + (not _CLOSERS & set(p)) for p in latin1]),
        np.array([len(p) for p in latin1]),
        np.array([bool(p) and 0xC2 <= ord(p[-1]) <= 0xF4 for p in latin1]),
        np.array([any(c in p for c in ',"{[:-0123456789') for p in latin1]),
        np.array([p in _OPENERS for p in latin1]),
        np.array([p == dialect.tool_call.begin for p in latin1]),
        np.array([p in opens for p in latin1]),
        latin1.index(end) if end in latin1 else -1,
    )


_NEEDS: dict[tuple[CallCompleter, str], int] = {}
""":func:`_need` by completer and call text: replies that differ only in ``max_tokens`` play the
same tokens until the budget first tells them apart, so their candidates repeat."""
_NEEDS_MAX = 1 << 18


@dataclass
class _View:
    """What a sampler sees at a step."""

    allowed: np.ndarray
    text: str
    """The reply so far (latin-1, one char a byte)."""
    state: RowState
    core: ConstraintCore
    rng: random.Random

    @cached_property
    def marks(self) -> _Marks:
        return _marks_for(self.core, self.state.dialect)

    @cached_property
    def tail(self) -> Tail:
        return read_tail(self.text, self.state.dialect)

    @cached_property
    def call(self) -> str | None:
        """The call the text ends inside (from its opening tag on), if any."""
        tail = self.tail
        if tail.open is not None and tail.open.kind == "call":
            return self.text[tail.open.start :]
        return None

    def first_allowed(self, which: np.ndarray) -> int | None:
        """The first allowed token ``which`` marks, if any."""
        allowed = self.allowed[self.allowed < len(which)]
        hits = allowed[which[allowed]]
        return int(hits[0]) if hits.size else None


Sampler = Callable[[_View], int]


def _tools(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t if "function" in t else {"type": "function", "function": t} for t in tools]


def _need(view: _View, extra: str) -> int:
    """The shortest completion, in tokens, of the call the text ends inside after ``extra``
    (-1 where ``extra`` closes it); a large number where none is known (the adversary then
    prefers it). The call starts at a clean point, so it is read alone."""
    budget = view.state.budget
    assert budget is not None and view.call is not None
    call = view.call + extra
    key = (budget.completer, call)
    if key in _NEEDS:
        return _NEEDS[key]
    tail = read_tail(call, view.state.dialect)
    if tail.open is None or tail.open.kind != "call":
        need = -1
    else:
        decoded = as_text(call)
        completion = budget.completer.complete(decoded)
        count = None if completion is None else budget.speller.count(as_latin1(completion))
        need = 1 << 20 if count is None else count
    if len(_NEEDS) >= _NEEDS_MAX:
        _NEEDS.clear()
    _NEEDS[key] = need
    return need


def _plain(view: _View) -> np.ndarray:
    """Allowed tokens that neither end the reply nor open or close a tag (all allowed if none)."""
    marks = view.marks
    allowed = view.allowed[view.allowed < len(marks.tags)]
    keep = allowed[~marks.tags[allowed] & ~np.isin(allowed, view.state.stop_ids)]
    return keep if keep.size else view.allowed


def _pick(view: _View, pool: np.ndarray) -> int:
    return int(pool[view.rng.randrange(len(pool))])


def _random(view: _View) -> int:
    return _pick(view, view.allowed)


def _call_tag(view: _View) -> int | None:
    """The allowed token that opens a call, if one does (outside a call)."""
    return None if view.call is not None else view.first_allowed(view.marks.call_begin)


def _longest(view: _View) -> int:
    tag = _call_tag(view)
    if tag is not None:
        return tag
    pool = _plain(view)
    if view.call is None or len(pool) == 1:
        return _pick(view, pool)
    marks = view.marks
    pool = pool[pool < len(marks.structural)]
    structural = pool[marks.structural[pool]]
    rng = view.rng
    sample = [
        int(structural[i]) for i in rng.sample(range(len(structural)), min(len(structural), _CANDIDATES))
    ]
    sample += [int(pool[i]) for i in rng.sample(range(len(pool)), min(len(pool), _CANDIDATES // 3))]
    sample += pool[marks.opener[pool]].tolist()
    latin1 = view.core.compiler.vocab.latin1
    return max(sample, key=lambda t: (_need(view, latin1[t]), len(latin1[t])))


def _late(view: _View) -> int:
    tag = _call_tag(view)
    if tag is not None:
        return tag
    pool = _plain(view)
    marks = view.marks
    valid = pool[pool < len(marks.score)]
    if not valid.size:
        return _pick(view, pool)
    rank = marks.score[valid] * 1000 + marks.length[valid]
    return _pick(view, valid[rank == rank.max()])


def _reasoning_tag(view: _View) -> int | None:
    """The allowed token that opens a reasoning span, if one does (outside every span)."""
    if view.tail.open is not None or view.tail.begun is not None:
        return None
    return view.first_allowed(view.marks.reasoning_begin)


def _lead_bytes(view: _View) -> int:
    tag = _reasoning_tag(view)
    if tag is not None:
        return tag
    pool = _plain(view)
    marks = view.marks
    valid = pool[pool < len(marks.lead)]
    leads = valid[marks.lead[valid]]
    return _pick(view, leads if leads.size else pool)


def _reopen(view: _View) -> int:
    tag = _reasoning_tag(view)
    return tag if tag is not None else _pick(view, _plain(view))


_SAMPLERS: dict[str, Sampler] = {
    "random": _random,
    "longest": _longest,
    "late": _late,
    "lead_bytes": _lead_bytes,
    "reopen": _reopen,
}


def _allowed(logits: torch.Tensor) -> np.ndarray:
    return np.flatnonzero(torch.isfinite(logits[0]).numpy())


class Driver(Protocol):
    """One row of a batch, played one token a step through some entry point to the core."""

    core: ConstraintCore

    def admit(self, extra_args: Any, scenario: Scenario) -> RowState:
        """Admit the request; its row's state."""
        ...

    def step(self, new: Sequence[int]) -> torch.Tensor:
        """Hand over the tokens committed since the last step; the next step's masked logits
        (one row, the core's width). An empty ``new`` is the first step."""
        ...


class CoreDriver:
    """The core alone: :meth:`ConstraintCore.admit` and :meth:`ConstraintCore.step`."""

    def __init__(self, core: ConstraintCore) -> None:
        self.core = core
        self._state: RowState | None = None

    def admit(self, extra_args: Any, scenario: Scenario) -> RowState:
        state = self.core.admit(
            extra_args,
            [],
            max_tokens=scenario.max_tokens,
            thinking_budget=scenario.thinking_budget,
            stop=scenario.stop,
        )
        assert state is not None
        self._state = state
        return state

    def step(self, new: Sequence[int]) -> torch.Tensor:
        assert self._state is not None
        logits = torch.zeros((1, self.core.vocab_size))
        self.core.step(logits, [(0, self._state, new)])
        return logits


def _sampling_params(extra_args: Any, scenario: Scenario) -> Any:
    from vllm.sampling_params import SamplingParams

    return SamplingParams(
        max_tokens=scenario.max_tokens,
        extra_args=extra_args,
        stop=list(scenario.stop) or None,
        thinking_token_budget=scenario.thinking_budget,
    )


class V1Driver:
    """The V1 adapter (:class:`~hermes_vllm.processor.v1.V1ToolCallLogitsProcessor`): the row is
    added by a ``BatchUpdate`` holding the output list, which the step appends to, as vLLM does.

    The adapter is handed ``core`` in place of the one it builds from ``vllm_config``, so that a
    run through it plays the same grammar engine as a run through the core.
    """

    def __init__(self, core: ConstraintCore, vllm_config: VllmConfig) -> None:
        from hermes_vllm.processor.v1 import V1ToolCallLogitsProcessor

        self.core = core
        self.proc = V1ToolCallLogitsProcessor(vllm_config, torch.device("cpu"), False)
        self.proc.core = core
        self._output: list[int] = []

    def admit(self, extra_args: Any, scenario: Scenario) -> RowState:
        from vllm.v1.sample.logits_processor import BatchUpdate

        self._output = []
        added: list[Any] = [(0, _sampling_params(extra_args, scenario), [], self._output)]
        self.proc.update_state(BatchUpdate(1, [], added, []))  # row 0's earlier reply is replaced
        return self.proc.rows[0][0]

    def step(self, new: Sequence[int]) -> torch.Tensor:
        self._output.extend(new)
        self.proc.update_state(None)
        logits = torch.zeros((1, self.core.vocab_size))
        return self.proc.apply(logits)


class V2Driver:
    """The V2 adapter (:class:`~hermes_vllm.processor.ToolCallLogitsProcessor`) on the V2
    runner's own buffers (:class:`~hermes_vllm.testing.v2_runner.V2Runner`): each reply in the
    next slot (slots are reused), its tokens committed to the slot's device buffer and read
    back by the adapter, its hooks called in ``release``'s order
    (:data:`~hermes_vllm.testing.v2_runner.CALL_ORDERS`), the runner's per-step update wrapped where
    ``step_hook``. Handed ``core`` as :class:`V1Driver` is."""

    _SLOTS = 4

    def __init__(
        self,
        core: ConstraintCore,
        vllm_config: VllmConfig,
        release: str = "0.34",
        max_len: int = 4096,
        step_hook: bool = True,
    ) -> None:
        from hermes_vllm.processor import ToolCallLogitsProcessor
        from hermes_vllm.testing.v2_runner import CALL_ORDERS, V2Runner

        self.core = core
        self.order = CALL_ORDERS[release]
        self.step_hook = step_hook
        self.runner = V2Runner(self._SLOTS, max_len, core.vocab_size)
        self.proc = ToolCallLogitsProcessor(vllm_config, self.runner.state)
        self.proc.core = core
        self._slot = -1
        self._admits = False

    def admit(self, extra_args: Any, scenario: Scenario) -> RowState:
        self._slot = (self._slot + 1) % self._SLOTS
        self.runner.admit(self._slot, [])
        assert self.proc.add_request(self._slot, _sampling_params(extra_args, scenario))
        self._admits = True
        return self.proc.slots[self._slot]

    def step(self, new: Sequence[int]) -> torch.Tensor:
        from hermes_vllm.testing.v2_runner import context, play_step

        for token in new:
            self.runner.commit(self._slot, token)
        logits = torch.zeros((1, self.core.vocab_size))
        admits, self._admits = self._admits, False
        return play_step(self.proc, self.order, admits, logits, context([self._slot]), self.step_hook)


def run(
    core: ConstraintCore | Driver, tokenizer: Any, scenario: Scenario, sampler: str, seed: int = 0
) -> Outcome:
    """Play one reply with ``sampler`` against ``core`` (built on ``tokenizer``'s vocabulary), or
    through a :class:`Driver` (an adapter) of one."""
    driver: Driver = CoreDriver(core) if isinstance(core, ConstraintCore) else core
    tools = _tools(scenario.tools)
    choice = scenario.choice
    if choice not in ("required", "auto", "none"):
        choice = {"type": "function", "function": {"name": choice}}
    state = driver.admit(constraint_args(tools, choice, answer=scenario.answer), scenario)
    latin1 = driver.core.compiler.vocab.latin1
    dialect = state.dialect
    marks = _marks_for(driver.core, dialect)
    end_id = marks.reasoning_end
    pick = _SAMPLERS[sampler]
    rng = random.Random(seed)
    outcome = Outcome(sampler, "", 0, owed=scenario.choice != "auto" or scenario.answer is not None)
    out: list[int] = []
    text = ""
    span: int | None = None  # vLLM's count in the open span
    new: list[int] = []
    while len(out) < scenario.max_tokens:
        budget = state.budget
        window = budget is not None and budget.max_tokens - state.consumed - len(new) <= budget.alert
        began = time.perf_counter()
        logits = driver.step(new)
        spent = time.perf_counter() - began
        if window:
            outcome.window_steps += 1
            outcome.window_seconds += spent
        else:
            outcome.other_steps += 1
            outcome.other_seconds += spent
        if state.failed is not None:
            outcome.failed = state.failed
            break
        allowed = _allowed(logits)
        if scenario.vllm_thinking and span is not None and span >= (scenario.thinking_budget or 0):
            token = end_id  # vLLM forces it, whatever the mask says
        else:
            token = pick(_View(allowed, text, state, driver.core, rng))
        out.append(token)
        new = [token]
        if token in state.stop_ids:
            outcome.ended_by = "stop token"
            break
        piece = latin1[token] if 0 <= token < len(latin1) else ""
        text += piece
        if span is None and 0 <= token < len(marks.reasoning_begin) and marks.reasoning_begin[token]:
            span = 0
        elif span is not None:
            span = None if token == end_id else span + 1
        decoded = as_text(text)
        hit = [decoded.index(s) for s in scenario.stop if s and s in decoded]
        if hit:
            outcome.ended_by = "stop string"
            text = as_latin1(decoded[: min(hit)])
            break
    if state.failed is None and new:
        driver.step(new)  # the last token reaches the engine (vLLM feeds it too)
        outcome.failed = state.failed
    outcome.tokens = len(out)
    outcome.text = as_text(text)
    _judge(outcome, tools, scenario, dialect, tokenizer, out)
    return outcome


def _judge(
    outcome: Outcome,
    tools: list[dict[str, Any]],
    scenario: Scenario,
    dialect: Dialect,
    tokenizer: Any,
    token_ids: Sequence[int],
) -> None:
    schemas = {s.name: s.parameters for s in normalize_tools(tools)}
    named = scenario.choice if scenario.choice not in ("required", "auto", "none") else None
    spans = split_spans(outcome.text, dialect, strict=True)
    if scenario.answer is not None:
        content = "".join(s.body for s in spans if s.kind == "text")
        try:
            jsonschema.validate(json.loads(content), scenario.answer)
            outcome.answered = True
        except (ValueError, jsonschema.ValidationError):
            outcome.answered = False
    for span in spans:
        if span.kind != "call":
            continue
        if not span.closed:
            outcome.cut = True
            continue
        try:
            payload = json.loads(span.body)
            if named is not None and payload["name"] != named:
                raise ValueError(f"called {payload['name']!r}, not the named {named!r}")
            jsonschema.validate(payload["arguments"], schemas[payload["name"]])
        except (ValueError, KeyError, TypeError, jsonschema.ValidationError) as err:
            outcome.invalid.append(f"{type(err).__name__}: {str(err)[:200]}")
            continue
        outcome.calls += 1
        outcome.payloads.append(payload)
    outcome.spans = span_token_counts(token_ids, tokenizer)


def span_token_counts(token_ids: Sequence[int], tokenizer: Any) -> list[int]:
    """Tokens inside each span the ``<think>`` token opens, up to its closing tag: the
    ``</think>`` token, or the tag spelled in several tokens, as the text reads (the processor and
    the reasoning parser read text; a model may write ``</`` ``think`` ``>``). Where the spelled
    tag begins inside a token, that token is not counted: a lower bound of what the text holds.

    A ``<think>`` token inside a call (its JSON body, before ``</tool_call>``) is the call's text,
    as the grammar and the parsers read it, not a span: a random model writes it into a string
    argument. A call's body ends where its JSON object does (:func:`_call_body_end`), so a
    ``</tool_call>`` inside a string does not end it."""
    begin, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    pieces = served_vocabulary(tokenizer).vocab.latin1  # each token's own bytes, as the parser reads them
    counts: list[int] = []
    inside = False
    text = ""
    ends: list[int] = []
    free = ""
    call: str | None = None
    for token in token_ids:
        piece = pieces[token] if 0 <= token < len(pieces) else ""
        if call is not None:  # inside a call: its text up to its closing tag
            call += piece
            done = _call_body_end(call)
            if done is not None:
                free, call = call[done:], None
        elif not inside:
            if token == begin:
                inside, text, ends, free = True, "", [], ""
                counts.append(0)
            else:
                free += piece
                at = free.find(CALL_TAGS[0])
                if at >= 0:
                    call, free = free[at + len(CALL_TAGS[0]) :], ""
                else:  # only a tag's first characters may be left to complete
                    free = free[len(free) - len(CALL_TAGS[0]) + 1 :]
        elif token == end:
            inside = False
        else:
            text += piece
            tag = text.find("</think>")
            if tag >= 0:  # closed by the tag in pieces: count the tokens wholly before it
                inside = False
                counts[-1] = sum(1 for e in ends if e <= tag)
            else:
                ends.append(len(text))
                counts[-1] += 1
    return counts


CALL_TAGS = ("<tool_call>", "</tool_call>")
"""The call tags :func:`span_token_counts` reads (the ``<think>`` dialect's)."""


def _call_body_end(call: str) -> int | None:
    """Where the text after a call's closing tag begins in ``call`` (the text after its opening
    tag), ``None`` while the call is open: its JSON object read whole, then the closing tag."""
    body = call.lstrip()
    try:
        _, length = json.JSONDecoder().raw_decode(body)
    except ValueError:
        return None
    at = body.find(CALL_TAGS[1], length)
    return None if at < 0 else len(call) - len(body) + at + len(CALL_TAGS[1])
