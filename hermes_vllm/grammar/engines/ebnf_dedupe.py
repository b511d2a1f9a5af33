"""Merge the equal rules of an xgrammar EBNF grammar, so each is compiled and stored once.

xgrammar writes every JSON schema of a structural tag with its own copy of the basic JSON rules
(strings, numbers, any value). A string rule's token masks take ~370 KiB on a 131k vocabulary, so a
turn of n tools held n copies: a 37-tool BFCL set took 10 MiB. Rules that expand alike are merged
here by partition refinement (as in DFA minimisation): rules start grouped by their text with rule
names blanked out, and a group splits until members refer, position by position, to rules of the
same group. Members of a final group derive the same strings, so one stands for all. The caller
says which rules may merge: xgrammar's masks depend on where a rule is used, not only on its text.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::= ", re.MULTILINE)
# A string literal, a character class, or a name. Literals and classes are matched first so that
# names inside them are never taken for rule references.
_LEXEME = re.compile(r'("(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z_][A-Za-z0-9_]*)')


def dedupe_rules(ebnf: str, root: str, mergeable: Callable[[str], bool] = lambda name: True) -> str:
    """``ebnf`` (xgrammar's printed form: each rule starts a line with ``name ::= ``), equal rules merged.

    Only rules whose name passes ``mergeable`` are merged; the others are kept as they are.
    """
    starts = list(_RULE.finditer(ebnf))
    if not starts or ebnf[: starts[0].start()].strip():
        raise ValueError("not a grammar in xgrammar's printed form")
    ends = [m.start() for m in starts[1:]] + [len(ebnf)]
    names = [m.group(1) for m in starts]
    index = {name: i for i, name in enumerate(names)}
    # Each body split into pieces; odd pieces are lexemes, of which some name rules.
    pieces = [_LEXEME.split(ebnf[m.end() : end].rstrip()) for m, end in zip(starts, ends, strict=True)]
    refs = [[index[p] for p in body[1::2] if p in index] for body in pieces]
    shapes = [
        "\0".join("\1" if i % 2 and p in index else p for i, p in enumerate(body))
        if mergeable(name)
        else "\2" + name
        for name, body in zip(names, pieces, strict=True)
    ]
    group = _refine(shapes, refs)
    keep: dict[int, int] = {}
    for i, g in enumerate(group):  # the first of each group stands for it, the root for its own
        keep.setdefault(g, i)
    keep[group[index[root]]] = index[root]
    rename = [names[keep[g]] for g in group]
    lines = [
        names[i]
        + " ::= "
        + "".join(rename[index[p]] if j % 2 and p in index else p for j, p in enumerate(body))
        for i, body in enumerate(pieces)
        if keep[group[i]] == i
    ]
    return "\n".join(lines) + "\n"


def _refine(shapes: list[str], refs: list[list[int]]) -> list[int]:
    """Coarsest grouping where members share a shape and refer to rules of the same groups."""
    ids: dict[object, int] = {}
    group = [ids.setdefault(shape, len(ids)) for shape in shapes]
    count = len(ids)
    while True:
        ids = {}
        group = [
            ids.setdefault((g, *[group[r] for r in rs]), len(ids)) for g, rs in zip(group, refs, strict=True)
        ]
        if len(ids) == count:
            return group
        count = len(ids)
