"""Reading a schema's regular expressions with Python's own parser."""

from __future__ import annotations

import re
import re._constants as sre  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
from typing import Any


def literal_characters(pattern: str) -> frozenset[str]:
    """The characters ``pattern`` names one by one (a literal, or a class member), however
    spelled (``"``, ``\\x22``, ``[\\\\"]``); empty for a pattern Python cannot parse."""
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return frozenset()
    found: set[str] = set()
    todo: list[Any] = [parsed]
    while todo:
        node = todo.pop()
        if isinstance(node, tuple) and len(node) == 2 and node[0] == sre.LITERAL:
            found.add(chr(node[1]))
        elif isinstance(node, (list, tuple, sre_parse.SubPattern)):
            todo.extend(node)
    return frozenset(found)


def optional_groups_spelled_out(pattern: str) -> str:
    """``pattern`` with each group made optional by ``?`` written ``{0,1}`` instead (lazy and
    possessive forms, ``??`` ``?+``, left alone).

    Both say the same; xgrammar 0.2.8 reads the first wrongly where the group ends in a repeat:
    ``^a(b[0-9]+)?Z$`` accepted ``a6Z`` (and a ``date-time``'s seconds ``:406Z``, through
    ``(\\.[0-9]+)?``), while ``{0,1}`` and ``(...|)`` are read right.
    """
    out: list[str] = []
    escaped = closed = False
    class_from = -1  # where the open character class's members begin; -1: outside one
    for i, ch in enumerate(pattern):
        if escaped:
            escaped = closed = False
        elif ch == "\\":
            escaped, closed = True, False
        elif class_from >= 0:
            if ch == "^" and i == class_from:
                class_from += 1
            elif ch == "]" and i > class_from:
                class_from = -1
        elif ch == "[":
            class_from, closed = i + 1, False
        elif ch == "?" and closed and pattern[i + 1 : i + 2] not in ("?", "+"):
            out.append("{0,1}")
            closed = False
            continue
        else:
            closed = ch == ")"
        out.append(ch)
    return "".join(out)
