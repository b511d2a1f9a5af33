"""One constrained row hosted as a vLLM ``StructuredOutputGrammar``, for speculative decoding.

Under speculative decoding vLLM's scheduler, not the model runner, keeps drafts inside a
request's grammar: it cuts each request's drafts to their longest valid prefix
(``validate_tokens``), fills one bitmask row per draft position plus the bonus row by accepting
the drafts one by one, rolls the grammar back, and after verification accepts the tokens the
model kept. Hosting our row (gate, matcher, budgets: :class:`~hermes_vllm.processor.core.RowState`,
advanced and masked by :class:`~hermes_vllm.processor.core.ConstraintCore`'s own methods) behind
that interface puts every draft position under the constraint sampled tokens get, on either
runner, with our engines, our cache and our budgets.

*Rollback.* Engines cannot copy a matcher, but they can roll one back; the rest of a row is
small. Before each accepted token the row is copied through its parts' own ``copy()`` (the row's
containers, its text follower, its budget's progress) together with its matcher's count of
accepted tokens; restoring the copy rolls the matcher back by the difference. Only the last
``num_speculative_tokens + 1`` copies are kept.

*Exactness.* Without drafts every token is preceded by a mask fill at its position, and a fill
moves the budget (it may begin forcing a text, or count a closed call). The scheduler rolls the
filled draft path back and then accepts the kept tokens in one call, so :meth:`accept_tokens`
settles the row before each token after the first as that position's fill would (the first
token's fill is the state the rollback restored): a row goes through exactly what it goes through
without drafts, hence the same masks and, under greedy sampling, the same text. Settling plans
the budget and computes the mask only where the mask can change the row (:meth:`RowHost.settle`).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.v1.structured_output.backend_types import StructuredOutputGrammar

from hermes_vllm.grammar import GrammarCompileError
from hermes_vllm.processor.core import ConstraintCore, Fill, RowState
from hermes_vllm.processor.forced_drafts import ForcedDrafts

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

    from hermes_vllm.grammar.compiler import ToolCallMatcher


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What restores a row: a copy of it (:meth:`RowState.copy`), its matcher's count of accepted
    tokens, whether it had ended."""

    copy: RowState
    accepted: int
    terminated: bool

    @classmethod
    def take(cls, state: RowState, terminated: bool) -> _Snapshot:
        matcher = state.engine.matcher
        accepted = matcher.accepted if matcher is not None else 0
        return cls(state.copy(), accepted, terminated)

    @property
    def matcher(self) -> ToolCallMatcher | None:
        return self.copy.engine.matcher

    def row(self) -> RowState:
        """A fresh row as the snapshot was taken (a snapshot may be restored more than once)."""
        return self.copy.copy()


class RowHost:
    """The engine process's core, shared by every hosted row.

    vLLM admits rows on its compile threads while the scheduler thread fills masks, so one lock
    guards the core (its bitmask row 0 is the scratch row of every settle).
    """

    def __init__(self, core: ConstraintCore, window: int) -> None:
        self.core = core
        self.window = window
        self.lock = threading.Lock()

    def grammar(self, params: SamplingParams) -> HostedGrammar:
        """Admit a request and wait for its compile, as vLLM's backends do on their compile thread
        (the request waits in ``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR``, the scheduler never does)."""
        with self.lock:
            state = self.core.admit_params(params)
        if state is None:
            raise ValueError("the request carries no hermes-vllm constraint")
        try:
            self.core.compiler.result(state.prepared, state.future)
        except GrammarCompileError as err:
            raise ValueError(f"hermes-vllm cannot compile this request's tools: {err}") from None
        return HostedGrammar(self, state)

    def fill_into(self, state: RowState, bitmask: torch.Tensor, row: int) -> None:
        """Fill ``bitmask[row]`` (vLLM's) for ``state``, every token allowed where nothing is masked.

        The core fills vLLM's bitmask in place: filling a row of its own and copying it cost a
        quarter of a fill. Both are sized from the model's vocabulary; where they are not alike
        the row cannot be filled in place."""
        core = self.core
        own = core.bitmask
        if bitmask.shape[1] != own.shape[1] or bitmask.dtype != own.dtype:
            raise ValueError(
                f"vLLM's bitmask ({bitmask.shape[1]} {bitmask.dtype} words a row) is not the "
                f"hermes-vllm core's ({own.shape[1]} {own.dtype})"
            )
        masked, _ = core.fill([(row, state)], core.vocab_size, bitmask=bitmask)
        if not masked:
            bitmask[row].fill_(-1)

    @cached_property
    def drafter(self) -> ForcedDrafts:
        """Finds the forced runs offered as grammar drafts (:mod:`~hermes_vllm.processor.forced_drafts`)."""
        from hermes_vllm.grammar.engines.composed import sorted_vocabulary

        vocab = self.core.compiler.vocab
        return ForcedDrafts(vocab.tokenizer, vocab.decoded, vocab.stop_token_ids, sorted_vocabulary(vocab))

    def settle(self, state: RowState) -> None:
        """What the fill at this position does to the row (:meth:`ConstraintCore.decide`), its mask
        computed only where the row depends on it: where a forced text may be refused by the
        grammar (the forcing is dropped) and where the row enters a quiet span (it is paused
        with that mask). The core's own bitmask row 0 is the scratch row."""
        core = self.core
        kind, plan = core.decide(state)
        if kind is Fill.PAUSE or (kind is Fill.BUDGETED and plan.force):
            core.fill_decided(core.bitmask, 0, state, kind, plan, core.vocab_size)

    def advance(self, state: RowState, token: int, plan: bool = True) -> bool:
        """Feed one token; False when it put the row out of its grammar. ``plan=False``: the
        budget does not plan the token's position first (a path that is restored afterwards)."""
        failed = state.failed
        if not plan and state.budget is not None:
            state.budget.skip_plan(state.consumed)
        self.core.advance(state, (token,))
        return failed is not None or state.failed is None


class HostedGrammar(StructuredOutputGrammar):  # type: ignore[misc]
    """A :class:`RowState` behind vLLM's per-request grammar interface."""

    def __init__(self, host: RowHost, state: RowState) -> None:
        self._host = host
        self._state = state
        self._terminated = False
        self._trail: deque[tuple[_Snapshot, int]] = deque(maxlen=host.window)
        """The row before each accepted token, and the token."""
        self._undone: list[_Snapshot] = []
        """The path the last rollback undid: the row before each of its tokens, then the row it
        was rolled back from (``_undone_tokens`` the tokens); emptied by any other call."""
        self._undone_tokens: list[int] = []
        self._initial = self._snapshot()

    @property
    def state(self) -> RowState:
        return self._state

    def _snapshot(self) -> _Snapshot:
        return _Snapshot.take(self._state, self._terminated)

    def _restore(self, snapshot: _Snapshot) -> None:
        row = snapshot.row()
        matcher = row.engine.matcher
        if matcher is not None and matcher.accepted > snapshot.accepted:
            matcher.rollback(matcher.accepted - snapshot.accepted)
        self._state = row
        self._terminated = snapshot.terminated

    def _accept(self, token: int, plan: bool = True) -> bool:
        ok = self._host.advance(self._state, token, plan)
        self._terminated = ok and token in self._state.stop_ids
        return ok

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Accept ``tokens``; False, with the row as it was before the call, where one is refused.

        vLLM 0.34 feeds every trimmed draft here while filling the bitmask, the first
        grammar-invalid one included, and then rolls back only the drafts that were accepted
        (``StructuredOutputGrammar.accept_tokens``: "a false result must leave the grammar state
        unchanged"). A refused token is found by asking the matcher first, so a draft never ends
        the row (nor logs one as failed)."""
        host = self._host
        with host.lock:
            before, trail = self._snapshot(), list(self._trail)
            done = self._redo(tokens)
            for i, token in enumerate(tokens[done:], done):
                if i > done:
                    host.settle(self._state)  # what the fill this position gets without drafts does
                self._trail.append((self._snapshot(), token))
                if self._terminated or not self._matcher_allows(token) or not self._accept(token):
                    self._trail = deque(trail, maxlen=host.window)
                    self._restore(before)
                    return False
        return True

    def _redo(self, tokens: list[int]) -> int:
        """Take the kept drafts from the path the last rollback undid instead of recomputing it.

        vLLM fills the draft path (a fill, then the draft, at each position), rolls it back and
        accepts the kept tokens at once: the kept drafts' rows were computed already, each after
        its position's fill (which is what settling emulates). Where that path's matcher took
        exactly one token a draft (one matcher throughout, never paused or replayed), it is fed
        the kept drafts again and the row becomes the path's row after the last of them and its
        next fill; the settle that fill stands for is skipped. Returns how many of ``tokens``
        were taken so (at most all but the last: the row after the last one's fill is not what
        accepting it leaves)."""
        undone, drafts = self._undone, self._undone_tokens
        self._undone, self._undone_tokens = [], []
        taken = 0
        limit = min(len(drafts), len(tokens) - 1)
        while taken < limit and tokens[taken] == drafts[taken]:
            taken += 1
        if not taken:
            return 0
        matcher = undone[0].matcher
        if matcher is None or any(
            s.matcher is not matcher or s.accepted != undone[0].accepted + i
            for i, s in enumerate(undone[: taken + 1])
        ):
            return 0
        for i, token in enumerate(tokens[:taken]):
            if not matcher.accept_token(token):  # an engine that does not repeat itself: recompute
                matcher.rollback(i)
                return 0
        self._trail.extend(zip(undone[:taken], tokens[:taken], strict=True))
        self._restore(undone[taken])
        return taken

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The drafts' longest prefix the grammar accepts (on a copy of the path, then restored).

        Like vLLM's own backends, this asks the matcher only, not the mask: a draft the budget or
        a refused stop string rules out is grammar-valid, and its own position's mask rejects it
        at verification (the mask a fill would compute here costs as much as the draft's row).
        """
        host = self._host
        with host.lock:
            self._undone, self._undone_tokens = [], []
            state = self._state
            matcher, engine = state.engine.matcher, state.engine
            if matcher is not None and not state.gate.on and engine.paused is None and engine.failed is None:
                return tokens[: self._valid_on_matcher(matcher, tokens)]
            start = self._snapshot()
            valid = 0
            for token in tokens:
                allowed = not self._terminated and self._matcher_allows(token)
                if not allowed or not self._accept(token, plan=False):
                    break
                valid += 1
            self._restore(start)
        return tokens[:valid]

    def _valid_on_matcher(self, matcher: ToolCallMatcher, tokens: list[int]) -> int:
        """How many of ``tokens`` the matcher takes, asked of the matcher alone, then rolled back.

        For a row whose engine runs everywhere (not gated), running and not paused, this is what
        feeding the whole row answers: the core feeds such a row's matcher every token and nothing
        else can refuse one (only a fill pauses a row or regates it; the budget never refuses a
        token). It skips the row's copy, the budget's following of each draft and the restore,
        and asks the matcher once per draft, not twice."""
        stops = self._state.stop_ids
        terminated = self._terminated
        valid = 0
        for token in tokens:
            if terminated or not matcher.accept_token(token):
                break
            valid += 1
            terminated = token in stops
        if valid:
            matcher.rollback(valid)
        return valid

    def _matcher_allows(self, token: int) -> bool:
        """Ask a running matcher first, so that a refused draft is not reported as a row the core
        had to end (it would log one, and the path is restored anyway). A paused row's matcher
        lags behind its span on purpose; the core never feeds it the span's content."""
        engine = self._state.engine
        matcher = engine.matcher
        if matcher is None or engine.paused is not None or engine.failed is not None:
            return True
        if not matcher.accept_token(token):
            return False
        matcher.rollback(1)
        return True

    def rollback(self, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        with self._host.lock:
            if num_tokens > len(self._trail):
                raise ValueError(
                    f"hermes-vllm keeps {len(self._trail)} tokens of rollback, asked for {num_tokens}"
                )
            undone = [self._trail.pop() for _ in range(num_tokens)][::-1]
            self._undone = [s for s, _ in undone] + [self._snapshot()]
            self._undone_tokens = [t for _, t in undone]
            self._restore(self._undone[0])

    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        with self._host.lock:
            self._undone, self._undone_tokens = [], []
            self._host.fill_into(self._state, bitmask, batch_index)

    def is_terminated(self) -> bool:
        return self._terminated

    # Grammar drafts (processor/forced_drafts.py): the walk runs on copies of the row.

    def forced_drafts(self, limit: int) -> list[int]:
        """Up to ``limit`` tokens the row's grammar forces next, spelled as the model would, each
        allowed by the row's mask at its position; the row is left where it was."""
        host = self._host
        with host.lock:
            self._undone, self._undone_tokens = [], []
            history = [token for _, token in list(self._trail)[-2:]]
            walk = _Walk(self)
            try:
                return host.drafter.offer(walk, history, limit)
            finally:
                self._restore(walk.start)

    def reset(self) -> None:
        with self._host.lock:
            self._trail.clear()
            self._undone, self._undone_tokens = [], []
            self._restore(self._initial)


class _Walk:
    """A hosted row advanced on a forced-run walk (:class:`~hermes_vllm.processor.forced_drafts.Walk`):
    each position filled into a scratch row, then its token accepted, as vLLM's draft path does."""

    def __init__(self, grammar: HostedGrammar) -> None:
        self._grammar = grammar
        self.start = grammar._snapshot()
        self._scratch = torch.zeros_like(grammar._host.core.bitmask[:1])

    def mask(self) -> np.ndarray | None:
        grammar = self._grammar
        if grammar._terminated:
            return None
        core = grammar._host.core
        masked, _ = core.fill([(0, grammar.state)], core.vocab_size, bitmask=self._scratch)
        return self._scratch[0].numpy() if masked else None

    def accept(self, token: int) -> bool:
        grammar = self._grammar
        return not grammar._terminated and grammar._matcher_allows(token) and grammar._accept(token)

    def restart(self) -> None:
        self._grammar._restore(self.start)
