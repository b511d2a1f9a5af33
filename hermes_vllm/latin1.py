"""Text as bytes, one latin-1 char a byte: how the budget, the gates and the core read tokens.

A token may end inside a UTF-8 character; read as latin-1 it is still text, tags (ASCII) are found
in it as they are, and these helpers say what a split character still needs. The one home of
these conversions (the budget, the spans reader, the matcher's gate and the processor use them).
"""

from __future__ import annotations


def as_latin1(text: str) -> str:
    """``text``'s UTF-8 bytes as latin-1, one char a byte: how the budget and the core read tokens."""
    return text.encode("utf-8").decode("latin-1")


def as_text(data: str) -> str:
    """The text ``data`` (bytes as latin-1 chars) spells, a split or invalid character read as
    U+FFFD: how a row's bytes are read back as the JSON a client sees."""
    return data.encode("latin-1").decode("utf-8", errors="replace")


def whole_characters(data: bytes) -> int:
    """Length of ``data``'s longest prefix that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if 0x80 <= byte < 0xC0:
            continue
        size = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
        return len(data) if back >= size else len(data) - back
    return len(data)


def finish_character(text: str) -> str:
    """Continuation bytes (latin-1) that complete a character split at the end of ``text``,
    chosen so the character is valid UTF-8 (no overlong form, no surrogate)."""
    for back in range(1, min(4, len(text)) + 1):
        byte = ord(text[-back])
        if 0x80 <= byte < 0xC0:
            continue
        size = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
        missing = size - back
        if missing <= 0:
            return ""
        first = {0xE0: 0xA0, 0xF0: 0x90}.get(byte, 0x80) if back == 1 else 0x80
        return chr(first) + "\x80" * (missing - 1)
    return ""


def utf8_need(need: int, data: str) -> int:
    """Continuation bytes still missing after ``data`` (bytes as latin-1 chars), given ``need`` before.

    Every byte but a continuation byte sets the need afresh: of a long text only the part from its
    last such byte is read (a character spans at most four bytes)."""
    if len(data) > 4:
        tail = data[-4:]
        if not all(0x80 <= ord(ch) < 0xC0 for ch in tail):
            data = tail
    for ch in data:
        byte = ord(ch)
        if 0x80 <= byte < 0xC0:
            need = max(need - 1, 0)
        else:
            need = 3 if byte >= 0xF0 else 2 if byte >= 0xE0 else 1 if byte >= 0xC0 else 0
    return need
