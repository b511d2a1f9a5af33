"""Many tools on xgrammar: a shared head grammar, a name automaton, per-tool grammars compiled lazily.

A grammar holding every tool costs xgrammar's mask precomputation for every rule up front (about
a second at 400 tools on a 131k vocabulary) and again for a set one tool away. Composed instead:

- the *head grammar* is the turn with each call a placeholder (``{"name":"","arguments":{}}``):
  the same for every tool set of a dialect, mode and parallel flag, so it compiles once;
- the call's head, from the call tag to the arguments' colon, is checked by a byte automaton
  (:mod:`.head`, the tools' names as a trie); the tokens it admits from a state are found once
  by walking it over the sorted vocabulary, and cached per state;
- each tool's grammar (its arguments, the call's end, then what may follow a call) is compiled
  when its name is written, and cached by its schema, so a new tool costs only when called.

The head grammar follows the free text (it ends calls and spans as the monolithic grammar does),
and is told each finished call as the placeholder. A token that completes a partly written call
tag and goes on into the head is decided by the automaton; one that goes past the arguments'
colon by the tool's grammar; one that ends a call and goes on is the tool's grammar's (it holds
the text after a call). Where a call tag completes in the free text, and where the call ends,
is read by :mod:`hermes_vllm.spans` (``CallTagScanner``, ``CallEndScanner``). The masks are
those of the monolithic grammar, bit for bit (``tests/test_grammar_composed.py``), where
:func:`composable` holds.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from hermes_vllm.grammar.engines.base import EngineGrammar, EngineMatcher
from hermes_vllm.grammar.engines.head import MONOLITHIC, Node, SortedVocabulary, admitted, build_head, walk
from hermes_vllm.spans import CallEndScanner, CallTagScanner
from hermes_vllm.turn import TurnSpec
from hermes_vllm.vocabulary import Vocabulary

logger = logging.getLogger(__name__)

PLACEHOLDER = '{"name":"","arguments":{}}'
"""What the head grammar is told of each finished call."""
NODE_BYTES = 200
"""Rough resident size of one automaton state, for the cache's byte bound."""


def _border_free(tag: str) -> bool:
    """No proper prefix of ``tag`` is also its suffix: a partly written tag is then read one way."""
    return not any(tag.endswith(tag[:k]) for k in range(1, len(tag)))


def composable(turn: TurnSpec, vocab: Vocabulary, min_tools: int) -> bool:
    """Where composing is exact and pays: enough tools, a call that must start with a known head
    (name first, or either key order with arguments first handed to the monolithic grammar), no
    token holding a whole call tag and more (``gate_allowed``), and a call tag read one way."""
    d = turn.dialect
    return (
        0 < min_tools <= len(turn.tools)
        and turn.mode != "none"
        and turn.answer is None
        and d.key_order in ("name_first", "either")
        and vocab.gate_allowed(d)
        and _border_free(d.tool_call.begin)
    )


class ComposedGrammar(EngineGrammar):
    """A tool set over a shared head grammar (see the module docstring)."""

    def __init__(
        self,
        turn: TurnSpec,
        vocab: Vocabulary,
        head: xgr.CompiledGrammar,
        tool: Callable[[int], Future[xgr.CompiledGrammar]],
        monolithic: Callable[[], xgr.CompiledGrammar],
    ) -> None:
        self.turn = turn
        self.vocab = vocab
        self.head = head
        self._tool = tool
        self._monolithic = monolithic
        self._mono: xgr.CompiledGrammar | None = None
        names = [json.dumps(t.name, ensure_ascii=False).encode() for t in turn.tools]
        self.start = build_head(names, turn.dialect.key_order, turn.max_whitespace)
        self._nodes = sum(len(n) for n in names) + 40 * len(names) * (turn.max_whitespace + 1)
        self._masks: dict[Node, np.ndarray] = {}
        self._crossings: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self._tool_starts: dict[int, xgr.GrammarMatcher] = {}
        self.words = (vocab.vocab_size + 31) // 32
        sorted_vocabulary(vocab)  # once per vocabulary, and not cheap: here, not at a first mask

    @property
    def memory_bytes(self) -> int:
        return int(self.head.memory_size_bytes * 2) + self._nodes * NODE_BYTES

    def matcher(self, stop_token_ids: Sequence[int]) -> ComposedMatcher:
        return ComposedMatcher(self, tuple(stop_token_ids))

    def sorted_vocabulary(self) -> SortedVocabulary:
        return sorted_vocabulary(self.vocab)

    def tool(self, index: int) -> Future[xgr.CompiledGrammar]:
        """Start (or join) the compile of tool ``index``'s grammar."""
        return self._tool(index)

    def tool_matcher(self, index: int, stops: Sequence[int]) -> xgr.GrammarMatcher:
        return xgr.GrammarMatcher(self._tool(index).result(), override_stop_tokens=list(stops))

    def monolithic(self) -> xgr.CompiledGrammar:
        """The grammar of every tool, for the ``arguments``-first branch (compiled when first needed)."""
        if self._mono is None:
            logger.debug(
                "composed turn of %d tools: arguments first, compiling them all", len(self.turn.tools)
            )
            self._mono = self._monolithic()
        return self._mono

    def crosses(self, exit: int, walked: bytes, rest: bytes) -> bool:
        """Whether ``rest``, after the head's exit, is accepted (``walked``: the head bytes so far)."""
        if exit == MONOLITHIC:
            matcher = xgr.GrammarMatcher(self.monolithic())
            return bool(matcher.accept_string(self.turn.dialect.tool_call.begin.encode() + walked + rest))
        if exit not in self._tool_starts:
            self._tool_starts[exit] = self.tool_matcher(exit, self.vocab.stop_token_ids)
        return bool(self._tool_starts[exit].fork().accept_string(rest))

    def node_mask(self, node: Node, path: bytes) -> np.ndarray:
        """The tokens the head admits at ``node`` (reached by ``path``), computed once."""
        mask = self._masks.get(node)
        if mask is None:
            ids = admitted(self.sorted_vocabulary(), node, lambda e, w, r: self.crosses(e, path + w, r))
            mask = self._masks[node] = _pack(ids, self.words)
        return mask

    def crossing(self, rest: bytes) -> tuple[np.ndarray, np.ndarray]:
        """For a partly written call tag with ``rest`` to come: the tokens that complete it and go
        on (the head grammar's verdict on them is replaced), and those of them the head admits."""
        if rest not in self._crossings:
            vocab = self.sorted_vocabulary()
            lo, hi = vocab.prefixed(rest)
            if lo < hi and vocab.keys[lo] == rest:
                lo += 1
            crossing, allowed = [], []
            for k in range(lo, hi):
                crossing += vocab.ids(k)
                after = vocab.keys[k][len(rest) :]
                reached = walk(self.start, after)
                if reached is not None and (
                    not reached[1] or self.crosses(_exit(reached[0]), after[: -len(reached[1])], reached[1])
                ):
                    allowed += vocab.ids(k)
            self._crossings[rest] = (_pack(crossing, self.words), _pack(allowed, self.words))
        return self._crossings[rest]


def _exit(node: Node) -> int:
    """The exit of a state that a walk left with bytes to spare (only exits stop a walk early)."""
    assert node.exit is not None
    return node.exit


_SORTED = "sorted"
"""The name of the vocabulary's sorted copy among its tables."""


def sorted_vocabulary(vocab: Vocabulary) -> SortedVocabulary:
    """One sorted copy per vocabulary (special tokens left out: xgrammar never allows them), a
    table the vocabulary keeps (the engine's start-up thread may be building it)."""

    def build() -> SortedVocabulary:
        excluded = frozenset(vocab.tokenizer_info.special_token_ids) | set(vocab.stop_token_ids)
        return SortedVocabulary(vocab.decoded, excluded)

    return vocab.table(_SORTED, build)


def sort_ahead(vocab: Vocabulary) -> None:
    """Build ``vocab``'s sorted copy in the background (a fraction of a second on 131k tokens:
    docs/architecture.md), so a server's first request with many tools does not pay for it:
    started with the engine."""
    if not vocab.has_table(_SORTED):
        name = "hermes-vllm-sort-vocab"
        threading.Thread(target=sorted_vocabulary, args=(vocab,), name=name, daemon=True).start()


def _pack(ids: Sequence[int], words: int) -> np.ndarray:
    """Token ids as a packed int32 bitmask row."""
    mask = np.zeros(words, dtype=np.uint32)
    if ids:
        array = np.asarray(ids, dtype=np.int64)
        np.bitwise_or.at(mask, array >> 5, (np.uint32(1) << (array & 31).astype(np.uint32)))
    return mask.view(np.int32)


_FREE, _HEAD, _TOOL, _MONO = range(4)


class ComposedMatcher(EngineMatcher):
    """One request's state over a :class:`ComposedGrammar`: in free text (the head grammar), in a
    call's head (the automaton), in a call's arguments (the tool's grammar), or handed over to the
    monolithic grammar (``arguments`` written first). Rollbacks replay from the start."""

    def __init__(self, grammar: ComposedGrammar, stops: tuple[int, ...]) -> None:
        self.g = grammar
        self.stops = stops
        self._decoded = grammar.vocab.decoded
        self._view: tuple[torch.Tensor, np.ndarray] | None = None
        self._reset()

    def _reset(self) -> None:
        g = self.g
        self.history: list[int] = []
        self.head = xgr.GrammarMatcher(g.head, override_stop_tokens=list(self.stops))
        self.state = _FREE
        self.text = CallTagScanner(g.turn.dialect)
        self.node = g.start
        self.path = b""
        self.tool: xgr.GrammarMatcher | None = None
        self.call: CallEndScanner | None = None
        self.mono: xgr.GrammarMatcher | None = None

    @property
    def inner(self) -> xgr.GrammarMatcher | None:
        """The xgrammar matcher whose mask is this one's as it is, for batch fills (None when the
        mask is the automaton's or needs a correction)."""
        if self.state == _FREE and not self.text.partial_call():
            return self.head
        if self.state == _TOOL:
            return self.tool
        if self.state == _MONO:
            return self.mono
        return None

    def accept_token(self, token_id: int) -> bool:
        if self._accept(token_id):
            self.history.append(token_id)
            return True
        return False

    def _accept(self, token_id: int) -> bool:
        if self.state == _MONO:
            assert self.mono is not None
            return bool(self.mono.accept_token(token_id))
        data = self._decoded[token_id] if 0 <= token_id < len(self._decoded) else b""
        if self.state == _FREE:
            return self._accept_free(token_id, data)
        if self.state == _HEAD:
            if token_id in self.stops or not data:
                return False
            return self._accept_head(token_id, data)
        assert self.tool is not None and self.call is not None
        if not self.tool.accept_token(token_id):
            return False
        self._follow_call(data)
        return True

    def _accept_free(self, token_id: int, data: bytes) -> bool:
        rest = self.text.partial_call().encode("latin-1")
        if rest and token_id not in self.stops and len(data) > len(rest) and data.startswith(rest):
            after = data[len(rest) :]
            reached = walk(self.g.start, after)
            if reached is None:
                return False
            node, left = reached
            if left and not self.g.crosses(_exit(node), after[: len(after) - len(left)], left):
                return False
            if not self.head.accept_string(data[: len(rest)]):
                return False
            self._open_call(after, token_id)
            return True
        if not self.head.accept_token(token_id):
            return False
        if token_id not in self.stops:
            self._follow_free(data, token_id)
        return True

    def _follow_free(self, data: bytes, token_id: int) -> None:
        opened = self.text.feed(data.decode("latin-1"))
        if opened is not None:
            self._open_call(data[opened:], token_id)

    def _open_call(self, data: bytes, token_id: int) -> None:
        self.state, self.node, self.path = _HEAD, self.g.start, b""
        self.text = CallTagScanner(self.g.turn.dialect)
        if data:
            self._accept_head(token_id, data, checked=True)

    def _crosses(self, node: Node, walked: bytes, rest: bytes) -> bool:
        return self.g.crosses(_exit(node), self.path + walked[: len(walked) - len(rest)], rest)

    def _accept_head(self, token_id: int, data: bytes, checked: bool = False) -> bool:
        reached = walk(self.node, data)
        if reached is None:
            return False
        node, rest = reached
        if node.monolithic:
            return self._to_monolithic(token_id)
        if rest and not checked and not self._crosses(node, data, rest):
            return False
        self.node, self.path = node, self.path + data[: len(data) - len(rest)]
        if node.tool is not None:
            self.g.tool(node.tool)  # start compiling it: it is needed a few bytes on
        if node.exit is not None:
            self.state = _TOOL
            self.tool = self.g.tool_matcher(node.exit, self.stops)
            self.call = CallEndScanner(self.g.turn.dialect)
            if rest:
                self.tool.accept_string(rest)
                self._follow_call(rest)
        return True

    def _follow_call(self, data: bytes) -> None:
        assert self.call is not None
        closed = self.call.feed(data.decode("latin-1"))
        if closed is None:
            return
        after = data[closed:]
        end = self.g.turn.dialect.tool_call.end.encode()
        self.head.accept_string(PLACEHOLDER.encode() + end + after)
        self.state, self.tool, self.call = _FREE, None, None
        opened = self.text.feed(after.decode("latin-1"))
        if opened is not None:  # the token ends with the next call's tag
            self._open_call(after[opened:], -1)

    def _to_monolithic(self, token_id: int) -> bool:
        """``arguments`` first: replay the tokens into the monolithic grammar, then offer it this one."""
        self.state = _MONO
        self.mono = xgr.GrammarMatcher(self.g.monolithic(), override_stop_tokens=list(self.stops))
        for t in self.history:
            self.mono.accept_token(t)
        return bool(self.mono.accept_token(token_id))

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        if self.state == _MONO:
            assert self.mono is not None
            return bool(self.mono.fill_next_token_bitmask(bitmask, row))
        if self.state == _TOOL:
            assert self.tool is not None
            return bool(self.tool.fill_next_token_bitmask(bitmask, row))
        view = self._view
        if view is None or view[0] is not bitmask:
            view = self._view = (bitmask, bitmask.numpy())
        if self.state == _HEAD:
            view[1][row] = self.g.node_mask(self.node, self.path)
            return True
        self.head.fill_next_token_bitmask(bitmask, row)
        rest = self.text.partial_call().encode("latin-1")
        if rest:
            crossing, allowed = self.g.crossing(rest)
            out = view[1][row] & ~crossing
            if self._may_open():
                out |= allowed
            view[1][row] = out
        return True

    def _may_open(self) -> bool:
        """Whether the head grammar lets the partly written call tag be completed here."""
        probe = self.head.fork()
        return bool(probe.accept_string(self.text.partial_call().encode("latin-1")))

    def rollback(self, num_tokens: int) -> None:
        history = self.history[: len(self.history) - num_tokens] if num_tokens > 0 else self.history
        self._reset()
        for token_id in history:
            self.accept_token(token_id)

    def is_terminated(self) -> bool:
        if self.state == _MONO:
            assert self.mono is not None
            return bool(self.mono.is_terminated())
        return self.state == _FREE and bool(self.head.is_terminated())

    def can_end(self) -> bool:
        if self.state == _MONO:
            assert self.mono is not None
            return bool(self.mono.is_completed())
        return self.state == _FREE and bool(self.head.is_completed())


def batch_inner(matchers: Sequence[EngineMatcher]) -> list[Any] | None:
    """The xgrammar matchers behind ``matchers`` where each has one (see ``ComposedMatcher.inner``)."""
    inner = []
    for m in matchers:
        x = getattr(m, "inner", None)
        if x is None:
            return None
        inner.append(x)
    return inner
