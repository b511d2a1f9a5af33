"""Tools -> compiled turn grammar -> per-request matcher: the public face of the grammar package."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any

import numpy as np
import torch

from hermes_vllm.constraint import ConstraintRequest
from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.gate import GATE_MARK_FIELDS, GateHistory, TextGate
from hermes_vllm.grammar.cache import GrammarCache
from hermes_vllm.grammar.engines import get_engine_class
from hermes_vllm.grammar.engines.base import (
    EngineGrammar,
    EngineMatcher,
    GrammarEngine,
    allocate_bitmask,
    token_allowed,
)
from hermes_vllm.grammar.turn import turn_spec
from hermes_vllm.grammar.unique import UniqueGuard
from hermes_vllm.latin1 import utf8_need
from hermes_vllm.memo import memoize_small
from hermes_vllm.metrics import CACHE_HITS, CACHE_MISSES, COMPILE_SECONDS
from hermes_vllm.schema import (
    Coverage,
    ToolSchemaError,
    ToolSpec,
    UnsatisfiableToolError,
    check_coverage,
    normalize_tool,
    read_tools,
)
from hermes_vllm.schema.unique import refuse_kept_unique
from hermes_vllm.settings import Limits, get_limits
from hermes_vllm.spans import TextFollower
from hermes_vllm.turn import ANSWER_NAME, TurnSpec
from hermes_vllm.vocabulary import Vocabulary

logger = logging.getLogger(__name__)


class GrammarCompileError(ValueError):
    """The tools could not be compiled (engine error or timeout); the message says why."""


@cache
def shared_cache() -> GrammarCache[EngineGrammar]:
    """The process-wide compiled-grammar cache (bounded by ``Limits.cache_bytes``)."""
    limits = get_limits()
    return GrammarCache(limits.cache_bytes, limits.compile_threads, lambda g: g.memory_bytes)


@dataclass(frozen=True)
class PreparedTurn:
    """A validated request, ready to compile: the spec plus what the policy decided."""

    spec: TurnSpec
    needs_validation: bool
    """Lenient coverage stripped keywords: finished calls must be checked with jsonschema."""
    original: tuple[ToolSpec, ...] = field(compare=False)
    """The tools before lenient stripping, for that post-hoc validation."""
    unusable: tuple[UnsatisfiableToolError, ...] = field(default=(), compare=False)
    """The request's tools no call can satisfy, left out of the grammar (and of the budgets)."""


def _prepare_turn(
    tools: Sequence[Any] | None,
    tool_choice: Any,
    parallel_tool_calls: bool,
    dialect: str | Dialect,
    coverage: Coverage,
    engine: type[GrammarEngine],
    limits: Limits,
    *,
    admitted: bool = False,
    answer: Mapping[str, Any] | None = None,
) -> PreparedTurn:
    """Validate a request against the schema rules, the limits and the engine's keyword coverage.

    Needs no tokenizer, so the frontend can run it on admission and answer HTTP 400. ``admitted``
    (the engine side of a request the frontend already checked) skips the metaschema check.
    ``answer`` (the final answer's JSON schema) is read like a tool's arguments, named
    :data:`ANSWER_NAME` in errors; an engine that cannot write one beside calls refuses it.
    """
    specs, unusable = read_tools(tools, limits, check_metaschema=not admitted)
    answer_spec = None
    if answer is not None:
        answer_spec = normalize_tool(
            {"name": ANSWER_NAME, "parameters": answer}, 0, limits, check_metaschema=not admitted
        )
    spec = turn_spec(
        specs, tool_choice, parallel_tool_calls, dialect, limits.max_call_whitespace, unusable, answer_spec
    )
    if spec.answers and not engine.answers:
        raise ToolSchemaError(
            ANSWER_NAME, "", f"the {engine.name} engine cannot serve a response_format beside tools "
            "(HERMES_VLLM_ENGINE=xgrammar or auto can)",
        )  # fmt: skip
    both = (*spec.tools, spec.answer) if spec.answers and spec.answer is not None else spec.tools
    if spec.answers and spec.answer is not None:
        refuse_kept_unique(spec.answer, "the processor keeps it inside calls only, not in an answer")
    covered, needs_validation = check_coverage(both, engine.supported_keywords, engine.name, coverage)
    kept = covered[: len(spec.tools)]
    return PreparedTurn(
        TurnSpec(
            spec.dialect, kept, spec.mode, spec.parallel, spec.max_whitespace,
            covered[-1] if spec.answers else spec.answer,
        ),
        needs_validation,
        spec.tools,
        unusable,
    )  # fmt: skip


@memoize_small(lambda request, *args, **kwargs: len(request.raw))
def prepare_constraint(
    request: ConstraintRequest, engine: type[GrammarEngine], limits: Limits, *, admitted: bool = False
) -> PreparedTurn:
    """:func:`_prepare_turn` of a request's decoded constraint, memoised by its JSON text.

    The one memo of prepared turns, for the logits processor's admission and its frontend check,
    which both pass the constraint the request's ``extra_args`` were decoded into once. Agents
    resend the same tools with every turn, and preparing them again (normalising, rewriting,
    coverage) costs milliseconds for a large tool set.
    """
    return _prepare_turn(
        list(request.tools), request.tool_choice, request.parallel_tool_calls, request.dialect,
        request.coverage, engine, limits, admitted=admitted, answer=request.answer,
    )  # fmt: skip


class ToolCallMatcher:
    """Per-request matcher: feed tokens, fill mask rows, roll back.

    With a *gate* (``auto`` turns with parallel calls), it follows the text as well. At a clean
    point (free text at a character boundary, no span open, no tag begun) the grammar is where it
    started. There the engine is left alone: :meth:`fill_bitmask` copies the mask of the grammar's
    start (computed once per compiled grammar) and :meth:`accept_token` reads that mask. Asking
    the engine costs several microseconds a token even in free text, and its work evicts the
    masks from the CPU caches. When a token leaves the clean point, a fresh engine matcher takes
    that token, and follows the text until the next clean point. The logits processor gates rows
    the same way.
    """

    def __init__(
        self,
        fresh: Callable[[], EngineMatcher],
        tokenizer: Any,
        gate: _Gate | None = None,
        unique: UniqueGuard | None = None,
    ) -> None:
        self._fresh = fresh
        self._inner = fresh()
        self._tokenizer = tokenizer
        self._gate = gate
        self._unique = unique
        """Keeps the items of ``uniqueItems`` arrays distinct (:mod:`hermes_vllm.grammar.unique`)."""
        self._view: tuple[torch.Tensor, np.ndarray] | None = None
        """The last bitmask filled and its numpy view: ``Tensor.numpy()`` costs microseconds."""
        self.accepted = 0
        """Tokens accepted, net of rollbacks: a snapshot of a row records it, and restoring the
        snapshot rolls the matcher back by the difference (engines cannot copy a matcher)."""
        self.batchable = self._inner.batchable if gate is None and unique is None else None
        """The engine's xgrammar matcher where this one adds nothing to it (no gate, no
        uniqueness guard: its engine matcher is then never replaced), else None: a step may
        accept and fill through it in batch (:attr:`EngineMatcher.batchable`), counting
        :attr:`accepted` itself."""

    def accept_token(self, token_id: int) -> bool:
        unique = self._unique
        if unique is not None and not unique.allows(token_id, self._inner):
            return False
        if self._accept(token_id):
            self.accepted += 1
            if unique is not None:
                unique.feed(token_id)
            return True
        return False

    def _accept(self, token_id: int) -> bool:
        gate = self._gate
        if gate is None:
            return self._inner.accept_token(token_id)
        if gate.terminated:
            return False
        if gate.clean:
            if not gate.start.allows(token_id):
                return False
            gate.feed(token_id)
            if not gate.clean and not gate.terminated:
                self._inner = self._fresh()
                self._inner.accept_token(token_id)  # allowed at the start, so accepted
            return True
        if not self._inner.accept_token(token_id):
            return False
        gate.feed(token_id)
        return True

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> bool:
        """Fill ``bitmask[row]``; False when every token is allowed (the row may be left alone)."""
        gate = self._gate
        if gate is not None and gate.clean:
            view = self._view
            if view is None or view[0] is not bitmask:
                view = self._view = (bitmask, bitmask.numpy())
            view[1][row] = gate.start.mask  # measured faster than np.copyto
            return True
        filled = self._inner.fill_bitmask(bitmask, row)
        if self._unique is not None and self._unique.active:
            if not filled:
                bitmask[row].fill_(-1)
            self.ban_repeats(bitmask, row)
            return True
        return filled

    def ban_repeats(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Clear from ``bitmask[row]`` (filled by the engine) the tokens that would close an item
        equal to an earlier one in a ``uniqueItems`` array; for callers that fill rows in batch."""
        if self._unique is not None and self._unique.active:
            self._unique.ban(bitmask[row].numpy())

    def rollback(self, num_tokens: int = 1) -> None:
        gate = self._gate
        if gate is not None:
            gate.rollback(num_tokens)  # first: beyond its window it refuses, the matcher unchanged
        self.accepted -= num_tokens
        if self._unique is not None:
            self._unique.rollback(num_tokens)
        if gate is None:
            self._inner.rollback(num_tokens)
            return
        if not gate.clean:  # rollbacks are rare: replay the tokens since the last clean point
            self._inner = self._fresh()
            for token_id in gate.pending:
                self._inner.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self._gate.terminated if self._gate is not None else self._inner.is_terminated()

    def can_end(self) -> bool:
        """Whether the output so far is complete (a stop token would be accepted now)."""
        if self._gate is not None and (self._gate.clean or self._gate.terminated):
            return self._gate.start.can_end
        return self._inner.can_end()

    @property
    def engine_matcher(self) -> EngineMatcher:
        return self._inner

    @property
    def alone(self) -> EngineMatcher | None:
        """The engine's matcher where nothing of this matcher's own acts on a token (no gate, no
        ``uniqueItems`` guard): a caller on a hot path may feed, fill and roll it back directly,
        counting :attr:`accepted` itself. ``None`` where this matcher must be asked."""
        return self._inner if self._gate is None and self._unique is None else None

    def accepts_text(self, text: str) -> bool:
        """True iff ``text``'s tokenization is accepted token by token and the output may end there.

        Consumes this matcher; use a fresh one per check.
        """
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        unique = self._unique
        for i in ids:
            if (unique is not None and not unique.allows(i, self._inner)) or not self._inner.accept_token(i):
                return False
            if unique is not None:
                unique.feed(i)
        return self._inner.can_end()


@dataclass(frozen=True)
class _Start:
    """What the engine says at the grammar's start, for one set of stop tokens."""

    mask: np.ndarray
    can_end: bool
    stops: frozenset[int]

    def allows(self, token_id: int) -> bool:
        return token_allowed(self.mask, token_id)


class _Gate(TextGate):
    """Follows a matcher's text to know when it is at a clean point (see :class:`ToolCallMatcher`),
    through the turn's one tag reader (:class:`~hermes_vllm.spans.TextFollower`) and the gates'
    shared text-following (:class:`~hermes_vllm.gate.TextGate`).

    A rollback puts back the mark taken before the first token it undoes; the marks of the last
    :data:`~hermes_vllm.gate.GATE_ROLLBACK` tokens are kept (:class:`~hermes_vllm.gate.GateHistory`),
    so a long turn keeps no history."""

    __slots__ = ("_history", "_latin1", "_utf8_need", "clean", "start", "terminated")

    def __init__(self, dialect: Dialect, latin1: list[str], start: _Start) -> None:
        super().__init__(TextFollower(dialect))
        self._latin1 = latin1
        self.start = start
        self._utf8_need = 0
        """Continuation bytes the last character still needs."""
        self.terminated = False
        """A stop token was accepted."""
        self.clean = True
        """At a clean point: read on every mask, so kept as a field."""
        self._history = GateHistory()

    def feed(self, token_id: int) -> None:
        self._history.push((*self.mark(), self._utf8_need, self.terminated, self.clean))
        if token_id in self.start.stops:
            self.terminated = True
            self.clean = False
            return
        text = self._latin1[token_id] if 0 <= token_id < len(self._latin1) else ""
        if self._utf8_need or not text.isascii():
            self._utf8_need = utf8_need(self._utf8_need, text)
        follower = self.follower
        follower.feed(text)
        self.clean = follower.tail.clean and self._utf8_need == 0
        if self.clean:
            if self.pending:
                self.pending = []
        else:
            self.pending.append(token_id)

    def rollback(self, num_tokens: int) -> None:
        """Stand where the gate stood before the last ``num_tokens`` tokens."""
        if num_tokens <= 0:
            return
        mark = self._history.back(num_tokens)
        self.back_to(mark)
        self._utf8_need, self.terminated, self.clean = mark[GATE_MARK_FIELDS:]


@dataclass(frozen=True)
class CompiledToolGrammar:
    """A request's turn grammar, compiled for one tokenizer and engine."""

    prepared: PreparedTurn
    grammar: EngineGrammar
    vocab: Vocabulary
    compile_ms: float
    _starts: dict[tuple[int, ...], _Start] = field(default_factory=dict, compare=False, repr=False)

    @property
    def spec(self) -> TurnSpec:
        return self.prepared.spec

    @property
    def memory_bytes(self) -> int:
        return self.grammar.memory_bytes

    def matcher(self, stop_token_ids: Sequence[int] | None = None, *, gated: bool = True) -> ToolCallMatcher:
        """A fresh matcher; extra ``stop_token_ids`` are allowed only where the turn may end.

        ``gated=False`` leaves out the clean-point gate (for callers that gate rows themselves).
        """
        stops = tuple(dict.fromkeys((*self.vocab.stop_token_ids, *(stop_token_ids or ()))))
        spec = self.spec
        gate = None
        if gated and spec.free_text and spec.parallel and self.vocab.gate_allowed(spec.dialect):
            gate = _Gate(spec.dialect, self.vocab.latin1, self._start(stops))
        tools = [(t.name, t.parameters) for t in spec.tools]
        unique = UniqueGuard.for_turn(spec.dialect, tools, self.vocab)
        return ToolCallMatcher(partial(self.grammar.matcher, stops), self.vocab.tokenizer, gate, unique)

    def _start(self, stops: tuple[int, ...]) -> _Start:
        """The mask at the grammar's start for these stop tokens, filled once."""
        if stops not in self._starts:
            row = allocate_bitmask(1, self.vocab.vocab_size)
            matcher = self.grammar.matcher(stops)
            matcher.fill_bitmask(row, 0)
            self._starts[stops] = _Start(row[0].numpy(), matcher.can_end(), frozenset(stops))
        return self._starts[stops]


class ToolGrammarCompiler:
    """Compiles a request's tools into the grammar the logits processor enforces.

    One compiler per (tokenizer, engine); compiled grammars are shared through a process-wide,
    byte-bounded cache keyed by (canonical turn, engine, tokenizer fingerprint).
    """

    def __init__(
        self,
        tokenizer: Any,
        engine: str = "xgrammar",
        dialect: str | Dialect = "hermes",
        *,
        vocab_size: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        coverage: Coverage = "strict",
        limits: Limits | None = None,
        cache: GrammarCache[EngineGrammar] | None = None,
    ) -> None:
        self.limits = limits or get_limits()
        self.vocab = Vocabulary.from_tokenizer(tokenizer, vocab_size, stop_token_ids)
        self.engine: GrammarEngine = get_engine_class(engine)(self.vocab)
        self.dialect = get_dialect(dialect)
        self.coverage: Coverage = coverage
        self.cache = cache if cache is not None else shared_cache()

    def prepare(
        self,
        tools: Sequence[Any] | None,
        tool_choice: Any = "auto",
        parallel_tool_calls: bool = True,
        dialect: str | Dialect | None = None,
        coverage: Coverage | None = None,
        *,
        admitted: bool = False,
    ) -> PreparedTurn:
        """Validate and normalise a request (synchronous); raises :class:`ToolSchemaError`.

        Not memoised as a whole (each tool's checks are, :func:`~hermes_vllm.schema.read_tools`):
        the processor's path, which sees the same tool set turn after turn, goes through
        :func:`prepare_constraint` with the request it decoded once.
        """
        return _prepare_turn(
            tools, tool_choice, parallel_tool_calls, dialect or self.dialect, coverage or self.coverage,
            type(self.engine), self.limits, admitted=admitted,
        )  # fmt: skip

    def warm(self) -> None:
        """Build the vocabulary's tables and pay the engine's one-time setup now: at start-up,
        not on a first request."""
        UniqueGuard.warm(self.vocab)
        tool = {"name": "warm_up", "parameters": {"type": "object"}}
        self.engine.warm(self.prepare([tool], "required").spec)

    def submit(self, prepared: PreparedTurn, counted: bool = True) -> Future[EngineGrammar]:
        """Start (or join) the compile of ``prepared`` on the background pool. ``counted``: this
        is the request's look at the cache for the hit and miss counters (a request looked
        at it once already passes False, so each admitted request counts once)."""
        key = (prepared.spec.key(), self.engine.name, self.vocab.fingerprint)
        misses = self.cache.misses
        future = self.cache.get(key, lambda: self._compile_now(prepared.spec))
        if counted:
            (CACHE_MISSES if self.cache.misses != misses else CACHE_HITS).inc()
        return future

    def _compile_now(self, spec: TurnSpec) -> EngineGrammar:
        start = time.perf_counter()
        grammar = self.engine.compile(spec)
        COMPILE_SECONDS.observe(time.perf_counter() - start)
        logger.debug(
            "compiled %d tools (%s, %s) in %.1f ms, %d bytes",
            len(spec.tools),
            spec.mode,
            spec.dialect.name,
            (time.perf_counter() - start) * 1e3,
            grammar.memory_bytes,
        )
        return grammar

    def result(
        self, prepared: PreparedTurn, future: Future[EngineGrammar], timeout: float | None = None
    ) -> CompiledToolGrammar:
        """Wait for a submitted compile; engine errors and timeouts become :class:`GrammarCompileError`."""
        start = time.perf_counter()
        limit = self.limits.compile_timeout_s if timeout is None else timeout
        try:
            grammar = future.result(timeout=limit)
        except FutureTimeout:
            raise GrammarCompileError(
                f"compiling the tools took longer than {limit:g} s (HERMES_VLLM_COMPILE_TIMEOUT_S)"
            ) from None
        except (ValueError, RuntimeError) as err:
            raise GrammarCompileError(str(err)) from None
        return CompiledToolGrammar(prepared, grammar, self.vocab, (time.perf_counter() - start) * 1e3)

    def compile(
        self,
        tools: Sequence[Any] | None,
        tool_choice: Any = "auto",
        parallel_tool_calls: bool = True,
        *,
        dialect: str | Dialect | None = None,
        coverage: Coverage | None = None,
    ) -> CompiledToolGrammar:
        """Validate, compile (or fetch from the cache) and return the turn grammar; blocking."""
        prepared = self.prepare(tools, tool_choice, parallel_tool_calls, dialect, coverage)
        return self.result(prepared, self.submit(prepared))
