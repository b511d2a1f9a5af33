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
