"""xgrammar's printed EBNF: split into rules, rename references, fold whitespace gaps.

The printed form starts each rule on a line with ``name ::= ``.

:func:`fold_gaps` joins each whitespace gap to the element after it. xgrammar writes a gap as a rule
of its own that may end after one whitespace character. Nearly every token that starts with a space
may then end it, so each gap rule's masks leave most of the vocabulary undecided. Its
crossing-grammar cache hits such a rule by shape but then re-checks every one of those tokens
against what follows in this grammar, a large share of a cold compile (docs/architecture.md, "The
turn grammar"). ``A gap B`` becomes
``A g`` with ``g ::= B | ws B``: what follows the whitespace is known inside ``g``, so those
tokens are settled while its masks are built. After a string (:data:`STRING`) the string joins
the rule too, for its fills' sake.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::= ", re.MULTILINE)
# A string literal, a character class, or a name. Literals and classes are matched first so that
# names inside them are never taken for rule references.
_LEXEME = re.compile(r'("(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z_][A-Za-z0-9_]*)')
# One element of a sequence (a literal, a class or a rule, each maybe repeated), or punctuation.
_ELEMENT = re.compile(
    r' *((?:"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z_][A-Za-z0-9_]*)'
    r"(?:[*+?]|\{\d+, ?-?\d+\})?|\(=|[()|])"
)
_WHITESPACE_CLASS = re.compile(r"\[(?: |\\t|\\n|\\r)+\]")
_MAX_FOLDED_WHITESPACE = 4
"""A gap of up to this many characters is folded (one alternative per count)."""


Rule = tuple[str, str]
"""A rule's name and body, as printed."""


def split_rules(ebnf: str) -> list[Rule]:
    """``(name, body)`` of each rule, in order; ``ValueError`` if ``ebnf`` is not in printed form."""
    starts = list(_RULE.finditer(ebnf))
    if not starts or ebnf[: starts[0].start()].strip():
        raise ValueError("not a grammar in xgrammar's printed form")
    ends = [m.start() for m in starts[1:]] + [len(ebnf)]
    return [(m.group(1), ebnf[m.end() : end].rstrip()) for m, end in zip(starts, ends, strict=True)]


def join_rules(rules: Sequence[Rule]) -> str:
    return "".join(f"{name} ::= {body}\n" for name, body in rules)


def reachable(rules: Mapping[str, str], names: Iterable[str]) -> set[str]:
    """``names`` and the rules they refer to, directly or not (lookaheads included)."""
    seen = set(names)
    todo = list(seen)
    while todo:
        for piece in _LEXEME.findall(rules.get(todo.pop(), "")):
            if piece in rules and piece not in seen:
                seen.add(piece)
                todo.append(piece)
    return seen


def rename(body: str, names: Mapping[str, str]) -> str:
    """``body`` with the rules it refers to renamed (names inside literals and classes are left alone)."""
    parts = _LEXEME.split(body)
    return "".join(names.get(p, p) if j % 2 else p for j, p in enumerate(parts))


def fold_gaps(ebnf: str, keep: Callable[[str], bool] = lambda name: False) -> str:
    """``ebnf`` with each whitespace gap that has an element after it joined to that element.

    A gap is a reference to a rule of one whitespace class, repeated 0 to n times (n <= 4), in
    either way xgrammar prints one: ``ws{0, n}``, or a rule ``("" | ([ \\n\\r\\t]))``. Rules whose
    name passes ``keep`` are left as they are (xgrammar caches the masks of its basic JSON rules
    across grammars by their exact context).
    Equal folded rules are written once.
    """
    rules = split_rules(ebnf)
    gaps = _gap_references(rules, ebnf)
    if not gaps:
        return ebnf
    # A set, not one alternation of every gap's name: a large tool set has thousands of gap
    # rules, and that pattern took about a second to build and search (400 BFCL tools).
    gap_names = {ref.split("{")[0] for ref in gaps}
    taken = {name for name, _ in rules}
    folded: dict[str, str] = {}  # body -> name of the rule holding it

    def joined(gap: str, before: list[str], after: str) -> str:
        """The rule ``before gap after`` (``before`` maybe empty), one alternative per count."""
        cls, most = gaps[gap]
        body = "(" + " | ".join(f"({' '.join([*before, *[cls] * n, after])})" for n in range(most + 1)) + ")"
        if body not in folded:
            folded[body] = _fresh("gap", taken)
        return folded[body]

    def fold(elements: list[str]) -> list[str]:
        elements = list(elements)
        for i in range(len(elements) - 3, -1, -1):  # a string, its gap, what follows: one rule
            if elements[i] == STRING and elements[i + 1] in gaps:
                elements[i : i + 3] = [joined(elements[i + 1], [STRING], elements[i + 2])]
        out: list[str] = []
        for element in reversed(elements):
            if element in gaps and out:
                element = joined(element, [], out.pop())
            out.append(element)
        return out[::-1]

    result = []
    for name, body in rules:
        # xgrammar drops the gap rules that end up unreferenced.
        mentions = not gap_names.isdisjoint(_LEXEME.findall(body))
        if not keep(name) and mentions and (parsed := _alternatives(body)) is not None:
            alternatives, rest = parsed
            body = "(" + " | ".join(f"({' '.join(fold(a))})" if a else '""' for a in alternatives) + ")"
            body += rest
        result.append((name, body))
    return join_rules(result + [(name, body) for body, name in folded.items()])


STRING = "basic_string"
"""xgrammar's rule of an unbounded JSON string. The gap after one is folded into a rule with the
string and the element after the gap (``S gap B`` becomes ``g ::= S B | S ws B``): where the
string's rule is followed by a rule, not by a literal, every token that closes the string and
goes on is checked again at each fill inside it, an eighth of such a fill (``benchmarks/README.md``)."""

_REPEATED = re.compile(r"\{0, ?(\d+)\}")
_OPTIONAL_CLASS = re.compile(r'\(""\s*\|\s*\((\[[^\]]*\])\)\)')
_SHORT = 32
"""Gap rules have short bodies; longer ones are not looked at."""


def _gap_references(rules: list[Rule], ebnf: str) -> dict[str, tuple[str, int]]:
    """Each way to refer to a gap (``ws{0, n}``, or an optional-class rule) -> (its class, n)."""
    short = [(name, body) for name, body in rules if len(body) <= _SHORT]
    chars: dict[str, str] = {}  # rule of one whitespace character -> its class
    gaps: dict[str, tuple[str, int]] = {}
    for name, body in short:
        if body.startswith("((") and _WHITESPACE_CLASS.fullmatch(body, 2, len(body) - 2):
            chars[name] = _canonical_class(body[2:-2])
        elif (optional := _OPTIONAL_CLASS.fullmatch(body)) and _WHITESPACE_CLASS.fullmatch(optional[1]):
            gaps[name] = (_canonical_class(optional[1]), 1)
    if chars:
        for match in _REPEATED.finditer(ebnf):
            start = match.start()
            while start and (ebnf[start - 1].isalnum() or ebnf[start - 1] == "_"):
                start -= 1
            name = ebnf[start : match.start()]
            if name in chars and 0 < int(match[1]) <= _MAX_FOLDED_WHITESPACE:
                gaps[name + match[0]] = (chars[name], int(match[1]))
    return gaps


def _canonical_class(cls: str) -> str:
    """One spelling per set of whitespace characters, so that equal folded rules are written once."""
    return "[" + "".join(c for c in (" ", "\\t", "\\n", "\\r") if c in cls[1:-1]) + "]"


def _alternatives(body: str) -> tuple[list[list[str]], str] | None:
    """A body ``((a b) | "" | (c))`` as its alternatives' elements plus what follows (a lookahead),
    or None where the body has another shape (a TagDispatch, nested groups): left alone."""
    matches = list(_ELEMENT.finditer(body))
    if not matches or matches[0][1] != "(" or "".join(m[0] for m in matches) != body:
        return None
    tokens = [m[1] for m in matches]
    alternatives: list[list[str]] = []
    i = 1
    while i < len(tokens):
        if tokens[i] == '""':
            alternatives.append([])
            i += 1
        elif tokens[i] == "(":
            j = i + 1
            while j < len(tokens) and tokens[j] not in ("(", ")", "|", "(="):
                j += 1
            if j == len(tokens) or tokens[j] != ")":
                return None
            alternatives.append(tokens[i + 1 : j])
            i = j + 1
        else:
            return None
        if i < len(tokens) and tokens[i] == "|":
            i += 1
        elif i < len(tokens) and tokens[i] == ")":
            return alternatives, body[matches[i].end() :]
        else:
            return None
    return None


def _fresh(stem: str, taken: set[str]) -> str:
    n = len(taken)
    while f"{stem}_{n}" in taken:
        n += 1
    taken.add(f"{stem}_{n}")
    return f"{stem}_{n}"


def merge_equal_rules(ebnf: str, keep: Callable[[str], bool] = lambda name: False) -> str:
    """``ebnf`` with rules of equal bodies written once (``root`` and rules passing ``keep`` stay).

    Two rules are merged when their bodies are the same text once the rules they refer to are
    merged, until nothing changes: equal bodies over equal rules match the same text, so the
    language is the same. A merge looks again only at the rules that refer to the merged one.
    """
    rules = split_rules(ebnf)
    parts = {name: _LEXEME.split(body) for name, body in rules}
    users: dict[str, list[str]] = {name: [] for name in parts}
    for name, pieces in parts.items():
        for ref in set(pieces[1::2]) & parts.keys():
            users[ref].append(name)
    canon = {name: name for name in parts}

    def find(name: str) -> str:
        while canon[name] != name:
            canon[name] = canon[canon[name]]
            name = canon[name]
        return name

    def text(name: str) -> str:
        return "".join(find(p) if j % 2 and p in canon else p for j, p in enumerate(parts[name]))

    owner: dict[str, str] = {}  # body over merged references -> the rule that keeps it
    todo = list(parts)
    while todo:
        merged = []
        for name in todo:
            if find(name) == name and name != "root" and not keep(name):
                kept = owner.setdefault(text(name), name)
                if kept != name:
                    canon[name] = kept
                    users[kept] += users[name]  # their text changes with the kept rule's merges
                    merged.append(name)
        todo = list(dict.fromkeys(user for name in merged for user in users[name]))
    return join_rules([(name, text(name)) for name, _ in rules if canon[name] == name])
