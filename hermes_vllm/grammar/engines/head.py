"""A tool call's head as a byte automaton: from the call tag to the arguments' colon.

The composed matcher (:mod:`.composed`) checks the head outside xgrammar: ``gap "{" gap`` then
the first key, ``"name" gap ":" gap NAME gap "," gap "arguments" gap ":"``, where NAME is one of
the tools' JSON-escaped names (a byte trie). Each gap is 0 to ``max_whitespace`` of ``[ \\t\\n\\r]``
and what follows a gap never starts with whitespace, so the automaton is deterministic. The exit
after the arguments' colon says which tool was named; the tool's own grammar takes the rest. With
the ``either`` key order, the ``"arguments"``-first branch is marked: any tool is live there, so
the matcher hands over to the monolithic grammar once the text enters it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

WHITESPACE = b" \t\n\r"
MONOLITHIC = -1
"""The exit of the ``"arguments"``-first branch: the monolithic grammar decides from there."""


@dataclass(eq=False)
class Node:
    """A state; identity is its hash (a mask is cached per node)."""

    edges: dict[int, Node] = field(default_factory=dict)
    exit: int | None = None
    """At the arguments' colon: the tool's index (or :data:`MONOLITHIC`); no edges then."""
    tool: int | None = None
    """Set on the state just after a tool's name: its grammar is needed a few bytes on."""
    monolithic: bool = False
    """Inside the ``"arguments"``-first branch."""


def _gap(most: int, after: Node) -> Node:
    """0 to ``most`` whitespace characters, then ``after``."""
    node = Node(dict(after.edges), monolithic=after.monolithic, tool=after.tool)
    for _ in range(most):
        edges = dict(after.edges)
        edges.update((byte, node) for byte in WHITESPACE)
        node = Node(edges, monolithic=after.monolithic, tool=after.tool)
    return node


def _trie(words: Sequence[tuple[bytes, Node]], monolithic: bool = False) -> Node:
    """Each word (none a prefix of another) then its own continuation."""
    root = Node(monolithic=monolithic)
    for word, after in words:
        node = root
        for byte in word[:-1]:
            node = node.edges.setdefault(byte, Node(monolithic=monolithic))
        if word[-1] in node.edges:
            raise ValueError(f"{word!r} is a prefix of another word")
        node.edges[word[-1]] = after
    return root


def _sequence(parts: Sequence[bytes | int], after: Node, monolithic: bool = False) -> Node:
    """Literals (bytes) and gaps (their bound, an int), in order, then ``after``."""
    node = after
    for part in reversed(parts):
        node = _gap(part, node) if isinstance(part, int) else _trie([(part, node)], monolithic)
    return node


def build_head(names: Sequence[bytes], key_order: str, max_whitespace: int) -> Node:
    """The head automaton's start (just after the call tag) for ``names`` (JSON text, quoted)."""
    gap = max_whitespace
    posts = []
    for index in range(len(names)):
        post = _sequence([gap, b",", gap, b'"arguments"', gap, b":"], Node(exit=index))
        post.tool = index
        posts.append(post)
    name_first = _sequence([gap, b":", gap], _trie(list(zip(names, posts, strict=True))))
    keys = [(b'"name"', name_first)]
    if key_order == "either":
        arguments_first = _sequence([gap, b":"], Node(exit=MONOLITHIC, monolithic=True), monolithic=True)
        keys.append((b'"arguments"', arguments_first))
    elif key_order != "name_first":
        raise ValueError(f"no composed head for key order {key_order!r}")
    root = _trie(keys)
    if key_order == "either":
        _mark_monolithic(root.edges[ord('"')].edges[ord("a")])
    return _sequence([gap, b"{", gap], root)


def _mark_monolithic(node: Node) -> None:
    """Mark ``node`` and what follows it (up to states already marked)."""
    todo = [node]
    while todo:
        current = todo.pop()
        if not current.monolithic:
            current.monolithic = True
            todo.extend(current.edges.values())


def walk(node: Node, data: bytes) -> tuple[Node, bytes] | None:
    """Follow ``data``: the state reached and the bytes left after an exit, or None if refused."""
    for i, byte in enumerate(data):
        if node.exit is not None:
            return node, data[i:]
        nxt = node.edges.get(byte)
        if nxt is None:
            return None
        node = nxt
    return node, b""


class SortedVocabulary:
    """The vocabulary's distinct byte strings, sorted: the tokens with a given prefix are one
    contiguous range, found by two bisects.

    The token ids are one flat array with each key's offset, not a list a key: a list a key was
    ~131k objects the garbage collector walked in every full collection (benchmarks/README.md,
    "Compile tail and cache hits")."""

    def __init__(self, decoded: Sequence[bytes], excluded: frozenset[int]) -> None:
        kept = [i for i, data in enumerate(decoded) if data and i not in excluded]
        kept.sort(key=decoded.__getitem__)  # stable: a key's ids stay in id order
        keys: list[bytes] = []
        starts: list[int] = []
        for at, token_id in enumerate(kept):
            data = decoded[token_id]
            if not keys or keys[-1] != data:
                keys.append(data)
                starts.append(at)
        self.keys = keys
        starts.append(len(kept))
        self._starts = np.asarray(starts, dtype=np.int64)
        self._flat = np.asarray(kept, dtype=np.int64)

    def ids(self, k: int) -> list[int]:
        """The token ids of key ``k``."""
        return self._flat[self._starts[k] : self._starts[k + 1]].tolist()  # type: ignore[no-any-return]

    def ids_in(self, lo: int, hi: int) -> np.ndarray:
        """The token ids of keys ``lo:hi``: the tokens of one :meth:`prefixed` range."""
        return self._flat[self._starts[lo] : self._starts[hi]]

    def prefixed(self, prefix: bytes, lo: int = 0, hi: int | None = None) -> tuple[int, int]:
        """The range of keys that start with ``prefix`` (within ``lo:hi``)."""
        hi = len(self.keys) if hi is None else hi
        start = bisect.bisect_left(self.keys, prefix, lo, hi)
        stripped = prefix.rstrip(b"\xff")
        if not stripped:
            return start, hi
        bound = stripped[:-1] + bytes([stripped[-1] + 1])
        return start, bisect.bisect_left(self.keys, bound, start, hi)


def admitted(vocab: SortedVocabulary, node: Node, crosses: Callable[[int, bytes, bytes], bool]) -> list[int]:
    """The tokens the automaton admits from ``node``: each walked whole without an exit, or
    reaching an exit with bytes left that ``crosses(exit, walked, rest)`` accepts. A depth-first
    walk over the automaton and the sorted vocabulary together: a handful of bisects a state."""
    out: list[int] = []
    stack: list[tuple[Node, bytes, int, int]] = [(node, b"", 0, len(vocab.keys))]
    while stack:
        current, prefix, lo, hi = stack.pop()
        for byte, nxt in current.edges.items():
            walked = prefix + bytes([byte])
            start, end = vocab.prefixed(walked, lo, hi)
            if start == end:
                continue
            if vocab.keys[start] == walked:
                out += vocab.ids(start)
                start += 1
            if nxt.exit is not None:
                for k in range(start, end):
                    if crosses(nxt.exit, walked, vocab.keys[k][len(walked) :]):
                        out += vocab.ids(k)
            elif start < end:
                stack.append((nxt, walked, start, end))
    return out
