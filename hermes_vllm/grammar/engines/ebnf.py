"""Rewrites of xgrammar's printed EBNF that keep the language and make the grammar cheaper.

Both passes read the printed form, in which each rule starts a line with ``name ::= ``.

:func:`dedupe_rules` merges equal rules. xgrammar writes every JSON schema of a structural tag with
its own copy of the basic JSON rules (strings, numbers, any value). A string rule's token masks
take ~370 KiB on a 131k vocabulary, so a turn of n tools held n copies: a 37-tool BFCL set took
10 MiB.

:func:`fold_gaps` joins each whitespace gap to the element after it. xgrammar writes a gap as a rule
of its own that may end after one whitespace character. Nearly every token that starts with a space
may then end it, so each gap rule's masks hold ~50k undecided tokens on a 131k vocabulary. Its
crossing-grammar cache hits such a rule by shape but then re-checks every one of those tokens
against what follows in this grammar: about a third of a cold compile. ``A gap B`` becomes
``A g`` with ``g ::= B | ws B``: what follows the whitespace is known inside ``g``, so those
tokens are settled while its masks are built.
"""

from __future__ import annotations

import re
from collections.abc import Callable

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


def split_rules(ebnf: str) -> list[tuple[str, str]]:
    """``(name, body)`` of each rule, in order; ``ValueError`` if ``ebnf`` is not in printed form."""
    starts = list(_RULE.finditer(ebnf))
    if not starts or ebnf[: starts[0].start()].strip():
        raise ValueError("not a grammar in xgrammar's printed form")
    ends = [m.start() for m in starts[1:]] + [len(ebnf)]
    return [(m.group(1), ebnf[m.end() : end].rstrip()) for m, end in zip(starts, ends, strict=True)]


def _join(rules: list[tuple[str, str]]) -> str:
    return "".join(f"{name} ::= {body}\n" for name, body in rules)


def dedupe_rules(ebnf: str, root: str, mergeable: Callable[[str], bool] = lambda name: True) -> str:
    """``ebnf`` with equal rules merged, by partition refinement (as in DFA minimisation).

    Rules start grouped by their text with rule names blanked out, and a group splits until its
    members refer, position by position, to rules of the same group. Members of a final group
    derive the same strings, so the first stands for all. Only rules whose name passes
    ``mergeable`` merge (the root never does): xgrammar's masks depend on where a rule is used,
    not only on its text.
    """
    rules = split_rules(ebnf)
    index = {name: i for i, (name, _) in enumerate(rules)}
    candidates = [i for i, (name, _) in enumerate(rules) if name != root and mergeable(name)]
    pieces = {i: _LEXEME.split(rules[i][1]) for i in candidates}  # odd pieces are lexemes
    refs = {i: [index[p] for p in pieces[i][1::2] if p in index] for i in candidates}
    group = list(range(len(rules)))  # a rule that may not merge is a group of its own
    shapes: dict[str, int] = {}
    for i in candidates:
        shape = "\0".join("\1" if j % 2 and p in index else p for j, p in enumerate(pieces[i]))
        group[i] = len(rules) + shapes.setdefault(shape, len(shapes))
    count = len(shapes)
    while True:
        ids: dict[tuple[int, ...], int] = {}
        for i, key in [(i, (group[i], *[group[r] for r in refs[i]])) for i in candidates]:
            group[i] = len(rules) + ids.setdefault(key, len(ids))
        if len(ids) == count:
            break
        count = len(ids)
    standing: dict[int, str] = {}
    rename = {}
    for i in candidates:
        first = standing.setdefault(group[i], rules[i][0])
        if first != rules[i][0]:
            rename[rules[i][0]] = first
    if not rename:
        return ebnf
    return _join(
        [
            (name, body if rename.keys().isdisjoint(_LEXEME.findall(body)) else _rename(body, rename))
            for name, body in rules
            if name not in rename
        ]
    )


def _rename(body: str, rename: dict[str, str]) -> str:
    parts = _LEXEME.split(body)
    return "".join(rename.get(p, p) if j % 2 else p for j, p in enumerate(parts))


def fold_gaps(ebnf: str, keep: Callable[[str], bool] = lambda name: False) -> str:
    """``ebnf`` with each whitespace gap that has an element after it joined to that element.

    A gap is a reference to a rule of one whitespace class, repeated 0 to n times (n <= 4), in any
    of the three ways xgrammar prints one. Rules whose name passes ``keep`` are left as they are
    (xgrammar caches the masks of its basic JSON rules across grammars by their exact context).
    Equal folded rules are written once.
    """
    rules = split_rules(ebnf)
    gaps = _gap_references(rules, ebnf)
    if not gaps:
        return ebnf
    mentions = re.compile("|".join(sorted({re.escape(ref.split("{")[0]) for ref in gaps})))
    taken = {name for name, _ in rules}
    folded: dict[str, str] = {}  # body -> name of the rule holding it

    def fold(elements: list[str]) -> list[str]:
        out: list[str] = []
        for element in reversed(elements):
            if element in gaps and out:
                cls, most = gaps[element]
                after = out.pop()
                body = "(" + " | ".join(f"({' '.join([cls] * n + [after])})" for n in range(most + 1)) + ")"
                if body not in folded:
                    folded[body] = _fresh("gap", taken)
                element = folded[body]
            out.append(element)
        return out[::-1]

    result = []
    for name, body in rules:
        # xgrammar drops the gap rules that end up unreferenced.
        if not keep(name) and mentions.search(body) and (parsed := _alternatives(body)) is not None:
            alternatives, rest = parsed
            body = "(" + " | ".join(f"({' '.join(fold(a))})" if a else '""' for a in alternatives) + ")"
            body += rest
        result.append((name, body))
    return _join(result + [(name, body) for body, name in folded.items()])


_REPEATED = re.compile(r"\{0, ?(\d+)\}")
_OPTIONAL_CLASS = re.compile(r'\(""\s*\|\s*\((\[[^\]]*\])\)\)')
_SHORT = 32
"""Gap rules have short bodies; longer ones are not looked at."""


def _gap_references(rules: list[tuple[str, str]], ebnf: str) -> dict[str, tuple[str, int]]:
    """Each way to refer to a gap (``ws{0, n}``, or a rule that is one) -> (its class, n)."""
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
        for name, body in short:  # a rule that is only a repeated gap, as our own regexes print
            if body.startswith("((") and body[2:-2] in gaps:
                gaps[name] = gaps[body[2:-2]]
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
