"""Neutralise control strings in rendered message text, reversibly.

vLLM re-tokenises a rendered chat template with special tokens enabled, so the prompt TEXT must
never spell a control string where a message put it, or a user could forge a system turn, a tool
call or a tool response. The strings escaped (:func:`escaped_strings`) are the dialect's turn
markers and tags, those of every built-in dialect (a tokenizer may hold another dialect's tags as
single tokens: Hermes tokenizers turn ``<tool_call>`` into one token under the bracket dialect too),
and the strings the dialect reserves for a tokenizer (its own added and special tokens, which only
the tokenizer knows: :func:`hermes_vllm.formats.token_check.reserve_tokens`).

Free text (message content) gets a WORD JOINER (U+2060: invisible, no meaning) after the first
character of every control-string occurrence. To stay reversible, a WORD JOINER that already
follows one of those first characters is doubled first::

    encode: (1) for each first character c: c+WJ -> c+WJ+WJ
            (2) for each control string p:  p -> p[0]+WJ+p[1:]
    decode: (1) for each control string p:  p[0]+WJ+p[1:] -> p
            (2) for each first character c: c+WJ+WJ -> c+WJ

JSON payloads (tool definitions, call arguments, non-string tool results) get the first character
of each control string replaced by its JSON unicode escape (``<`` -> ``\\u003c``). A control
string can only sit inside a JSON string, where the escape means the same character, so
``json.loads`` restores the value with no decode step.

Every scheme is an ordered list of plain ``str.replace`` steps, so the Jinja chat template
applies exactly the same steps (:mod:`hermes_vllm.formats.chat_template` injects them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from functools import cache

from hermes_vllm.dialect import Dialect, available_dialects, get_dialect

WORD_JOINER = "\u2060"

Step = tuple[str, str]
"""One ``str.replace(old, new)``."""

# A JSON escape must not be able to start inside another escape (``\n``, ``\u12ab``): a control
# string whose first character could follow a backslash in JSON cannot be escaped this way.
_JSON_ESCAPE_CHARS = frozenset('"\\/bfnrtu0123456789abcdefABCDEF')


# What JSON text may hold outside strings: a string made of these alone (or holding a quote) could
# sit in the structure, where an escape would change the JSON.
_JSON_STRUCTURE_CHARS = frozenset('{}[],: \t\n\r-+.0123456789eEtrufalsn"')


def escapable(text: str) -> bool:
    """Whether a WORD JOINER after the first character breaks every occurrence of ``text``.

    It must have two characters or more and no border (no proper prefix that is also a suffix:
    ``<s>`` has none, ``aa`` or ``<x<`` do), so that no two occurrences overlap and one pass of
    ``str.replace`` reaches them all; and no WORD JOINER.
    """
    return (
        len(text) > 1
        and WORD_JOINER not in text
        and not any(text[:k] == text[-k:] for k in range(1, len(text)))
    )


def _json_escapable(text: str) -> bool:
    """Whether ``text`` can only occur inside a JSON string, and not inside an escape there."""
    return text[0] not in _JSON_ESCAPE_CHARS and '"' not in text and not set(text) <= _JSON_STRUCTURE_CHARS


@cache
def _builtin_control_strings() -> tuple[str, ...]:
    return tuple(dict.fromkeys(s for name in available_dialects() for s in get_dialect(name).control_strings))


def escaped_strings(dialect: str | Dialect = "hermes") -> tuple[str, ...]:
    """What message text must never spell: the dialect's control strings (its tags and reserved
    strings), then every built-in dialect's (see the module docstring)."""
    d = get_dialect(dialect)
    return tuple(dict.fromkeys((*d.control_strings, *_builtin_control_strings())))


def _first_chars(strings: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p[0] for p in strings))


@cache
def text_escape_steps(dialect: str | Dialect = "hermes") -> tuple[Step, ...]:
    """The replacements :func:`escape_text` applies, in order."""
    strings = escaped_strings(dialect)
    doubled = tuple((c + WORD_JOINER, c + WORD_JOINER * 2) for c in _first_chars(strings))
    return doubled + tuple((p, p[0] + WORD_JOINER + p[1:]) for p in strings)


@cache
def text_unescape_steps(dialect: str | Dialect = "hermes") -> tuple[Step, ...]:
    """The replacements :func:`unescape_text` applies: the escape steps undone in reverse order."""
    return tuple((new, old) for old, new in reversed(text_escape_steps(dialect)))


def _json_unicode_escape(char: str) -> str:
    units = char.encode("utf-16-be")
    return "".join(f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2))


@cache
def json_escape_steps(dialect: str | Dialect = "hermes") -> tuple[Step, ...]:
    """The replacements :func:`escape_json_text` applies, in order.

    A reserved string that could sit in the JSON structure or inside an escape is left out
    (no known tokenizer has one; ``validate_prompt_tokens`` counts what reaches the model).
    """
    d = get_dialect(dialect)
    tags = escaped_strings(dataclasses.replace(d, reserved=()))
    unsafe = [p for p in tags if p[0] in _JSON_ESCAPE_CHARS]
    if unsafe:
        raise ValueError(f"dialect {d.name!r}: control strings {unsafe} start with a JSON escape character")
    strings = [*tags, *(p for p in d.reserved if p not in tags and _json_escapable(p))]
    return tuple((p, _json_unicode_escape(p[0]) + p[1:]) for p in strings)


def apply_steps(text: str, steps: Iterable[Step]) -> str:
    """Apply ``str.replace`` steps in order (the template's ``apply_steps`` macro does the same)."""
    for old, new in steps:
        text = text.replace(old, new)
    return text


def escape_text(text: str, dialect: str | Dialect = "hermes") -> str:
    """Free text with every control string of ``dialect`` broken by a WORD JOINER."""
    return apply_steps(text, text_escape_steps(dialect))


def unescape_text(text: str, dialect: str | Dialect = "hermes") -> str:
    """The exact inverse of :func:`escape_text`."""
    return apply_steps(text, text_unescape_steps(dialect))


def escape_json_text(json_text: str, dialect: str | Dialect = "hermes") -> str:
    """Serialised JSON with the control strings' first characters written as ``\\uXXXX``."""
    return apply_steps(json_text, json_escape_steps(dialect))
