"""spans' readers of where a call ends: :func:`payload_end` over finished text, and
:class:`CallEndScanner` over a call written piece by piece (the composed matcher's), which must
read it as :func:`split_spans` reads the finished call."""

from __future__ import annotations

import dataclasses
import json
from itertools import pairwise

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hermes_vllm import spans
from hermes_vllm.dialect import Dialect, TagPair, get_dialect
from hermes_vllm.spans import CallEndScanner, TextFollower, payload_end, split_spans

HERMES = get_dialect("hermes")


def _after(pieces: list[str], dialect: Dialect = HERMES) -> str | None:
    """The text after the call's closing tag as the scanner splits the pieces (None: still open)."""
    scanner = CallEndScanner(dialect)
    for k, piece in enumerate(pieces):
        at = scanner.feed(piece)
        if at is not None:
            assert 0 < at <= len(piece)
            return piece[at:] + "".join(pieces[k + 1 :])
    return None


def _cuts(text: str) -> list[list[str]]:
    """``text`` whole, a character a piece, and cut in three at every pair of places."""
    out = [[text], list(text)]
    out += [[text[:i], text[i:j], text[j:]] for i in range(len(text) + 1) for j in range(i, len(text) + 1)]
    return out


@pytest.mark.parametrize(
    ("arguments", "after"),
    [
        (' {"a": 1}}</tool_call>rest', "rest"),
        ('{"q": "</tool_call>"}}</tool_call>after', "after"),  # a tag inside a string
        (' {"q": "a\\"}</tool_call>\\\\"}}\n</tool_call>\nnext', "\nnext"),  # escaped quote, backslash
        (' {"a": "}]{[", "b": [[1], {"c": []}]} }\n</tool_call>', ""),  # brackets in strings, nested
        (" {}}</tool_call><tool_call>", "<tool_call>"),  # the next call's tag right after
        (" {\"a\": 'x}</tool_call>'}</tool_call>z", "'}</tool_call>z"),  # ' opens no JSON string
    ],
)
def test_the_call_ends_at_the_first_closing_tag_after_its_arguments(arguments: str, after: str) -> None:
    for pieces in _cuts(arguments):
        assert _after(pieces) == after, pieces


def test_a_backslash_ending_a_piece_escapes_the_next_pieces_first_character() -> None:
    pieces = [' {"q": "x\\', '"}</tool_call>', '"}}</tool_call>z']
    assert _after(pieces) == "z"
    pieces = [' {"q": "x\\', "n", '"}}</tool_call>z']  # the escaped character is the whole piece
    assert _after(pieces) == "z"


def test_a_closing_tag_split_across_pieces_ends_the_call_in_its_last_piece() -> None:
    pieces = [' {"a": 1}}', "</tool", "_call", ">rest"]
    scanner = CallEndScanner(HERMES)
    assert [scanner.feed(p) for p in pieces] == [None, None, None, 1]


@pytest.mark.parametrize(
    "pieces",
    [
        [' {"a": "</tool_call>'],  # the tag is in a string
        [' {"a": {"b": 1}', "</tool_call>"],  # the arguments are still open
        [' {"a": 1}}', "</tool_cal"],  # the tag is not complete
        [' {"a": "x\\"}}</tool_call>'],  # the quote is escaped
    ],
)
def test_an_open_call_does_not_end(pieces: list[str]) -> None:
    assert _after(pieces) is None


def test_offsets_are_the_bytes_of_latin1_text_with_another_dialects_tag() -> None:
    brackets = get_dialect("chatml-brackets")
    text = ' {"é": "[/tool_call]ツ"}}[/tool_call]ok'.encode().decode("latin-1")
    scanner = CallEndScanner(brackets)
    assert scanner.feed(text) == len(text) - 2
    wide = dataclasses.replace(HERMES, tool_call=TagPair("<ツール>", "</ツール>"))
    for pieces in _cuts('{"a":"ツ"}}</ツール>ok'.encode().decode("latin-1")):
        assert _after(pieces, wide) == "ok"


PIECES = ["a", " ", '"', "\\", "'", "{", "}", "[", "]", "</tool_call>", "</tool", "é", "\n"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.lists(st.sampled_from(PIECES), max_size=6).map("".join),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    arguments=st.dictionaries(st.sampled_from(PIECES), json_values, max_size=3),
    spaces=st.sampled_from(["", " ", "\n"]),
    rest=st.sampled_from(["", "x", "\n<tool_call>", "</tool_call>"]),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
def test_the_scanner_ends_a_call_where_split_spans_ends_the_finished_one(
    arguments: dict[str, object], spaces: str, rest: str, cuts: list[int]
) -> None:
    value = spaces + json.dumps(arguments, ensure_ascii=False) + spaces + "}" + spaces
    turn = '<tool_call>{"name": "f", "arguments":' + value + "</tool_call>" + rest
    call = split_spans(turn, HERMES, strict=True)[0]
    assert call.kind == "call" and call.closed
    data = (value + "</tool_call>" + rest).encode().decode("latin-1")
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    pieces = [data[a:b] for a, b in pairwise(bounds)]
    after = _after(pieces)
    assert after is not None
    assert after.encode("latin-1").decode() == turn[call.end :]


@pytest.mark.parametrize(
    ("text", "pos", "end"),
    [
        ('{"a": 1} tail', 0, 8),
        ("x {'a': '}'} tail", 2, 12),  # a Python repr: single quotes
        ('{"a": "it\'s }"}', 0, 15),  # a single quote inside a JSON string
        ('{"a": "\\"}"}', 0, 12),  # an escaped quote
        ('{"a": [1, {"b": "]"}]}}', 0, 22),
        ('{"a": "}', 0, None),
        ('{"a": "x\\', 0, None),
        ("{'a': \"}\", 'b': 1}", 0, 18),
        ("]{}", 0, None),  # only a closer bringing the depth from 1 to 0 closes it
    ],
)
def test_payload_end_reads_both_quote_styles(text: str, pos: int, end: int | None) -> None:
    assert payload_end(text, pos) == end


FOLLOWED = [*PIECES, "<tool_call>", "<tool", "_call>", "<think>", "</think>", "</", '{"a": ', "x" * 40]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(FOLLOWED), max_size=30))
def test_the_follower_reads_the_tail_its_text_has(pieces: list[str]) -> None:
    """Wherever the follower reads its tail (a short text's kept, a call's end read alone), the
    tail is the one a full reading of its text gives."""
    follower = TextFollower(HERMES)
    for piece in pieces:
        if follower.feed(piece) and not follower.tail.clean:
            assert follower.tail == spans.reader_of(HERMES).read(follower.text), follower.text


def test_a_call_followed_again_reads_no_span_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's follower reads its tail at the call's tags: the opening tag alone is a short text
    whose tail is kept for every row, and inside the call only the call's end is looked for (its
    payload, then its closing tag), not every tag of the dialect from the text's start. So a
    second row following the same call, a closing tag inside a string included, reads no text
    for its span boundaries (:meth:`spans.DialectReader.bounds`)."""
    pieces = [
        "<tool_call>",
        "\n",
        '{"name": "f", "arguments": {"a": "',
        "</tool_call>",
        '"}}',
        "\n",
        "</tool_call>",
    ]
    first = TextFollower(HERMES)
    for piece in pieces:
        first.feed(piece)
    assert first.tail.clean and first.calls == 1
    read = 0
    bounds = spans.DialectReader.bounds

    def counted(self: spans.DialectReader, text: str, strict: bool) -> object:
        nonlocal read
        read += 1
        return bounds(self, text, strict)

    monkeypatch.setattr(spans.DialectReader, "bounds", counted)
    second = TextFollower(HERMES)
    assert [second.feed(piece) for piece in pieces] == [True, False, False, True, False, False, True]
    assert second.tail.clean and second.calls == 1
    assert read == 0


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab"\\{}[]<>/\n é', max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='k"\\}', max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    value=st.dictionaries(st.text(max_size=3), JSONISH, max_size=3),
    cut=st.integers(0, 200),
    gap=st.sampled_from(["", "\n", " x"]),
)
def test_a_calls_end_is_where_the_bracket_reader_ends_its_payload(
    value: dict[str, object], cut: int, gap: str
) -> None:
    """A call's payload read by json's scanner (whole JSON) ends where the bracket reader ends it,
    whole or cut anywhere (a text still being written), for any strings, escapes and tags in them."""
    payload = json.dumps(value, ensure_ascii=False)
    text = f"<tool_call>\n{payload}{gap}</tool_call>tail"[: len(payload) + 12 + cut]
    close = payload_end(text, 12)
    tag_at = -1 if close is None else text.find("</tool_call>", close)
    want = None if tag_at == -1 or text[close:tag_at].strip() else (tag_at, tag_at + 12)
    assert spans._call_end(text, 11, "</tool_call>", True) == want


def test_a_whole_json_payload_is_read_at_c_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call whose payload is whole JSON (what a grammar writes) is ended by json's scanner: the
    bracket reader (a Python loop over the payload's brackets and strings) does not run. It reads
    what is not JSON (a Python literal), and nothing is read while no closing tag follows."""
    read: list[str] = []
    feed = spans._Depth.feed

    def counted(self: spans._Depth, text: str, i: int = 0) -> int | None:
        read.append(text)
        return feed(self, text, i)

    monkeypatch.setattr(spans._Depth, "feed", counted)
    call = '<tool_call>\n{"name": "f", "arguments": {"a": "x}</tool_call>", "b": [1, {"c": null}]}}\n</tool_call>'
    assert [s.kind for s in split_spans(call + "after", strict=True)] == ["call", "text"]
    assert split_spans(call[:-1], strict=True)[0].closed is False
    assert read == []
    legacy = "<tool_call>\n{'name': 'f', 'arguments': {}}\n</tool_call>"
    assert split_spans(legacy, strict=True)[0].closed
    assert len(read) == 1


def test_the_tail_after_a_call_is_kept_by_the_texts_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no span is open at its end, a text's tail depends only on its last characters (those
    a tag may begin in) and its count of calls: once read, it is kept by them, so a row closing
    another call the same way looks for no partial tag; a text ending otherwise is read."""
    first = TextFollower(HERMES)
    for piece in ("<tool_call>", '\n{"name": "f", "arguments": {}}\n', "</tool_call>"):
        first.feed(piece)
    assert first.tail.clean and first.calls == 1
    looked: list[str] = []
    suffix = spans.partial_tag_suffix

    def counted(text: str, tags: tuple[str, ...]) -> int:
        looked.append(text)
        return suffix(text, tags)

    monkeypatch.setattr(spans, "partial_tag_suffix", counted)
    second = TextFollower(HERMES)
    second.feed("<tool_call>")
    second.feed('\n{"name": "g", "arguments": {"a": [1, 2]}}\n')
    assert looked == []
    second.feed("</tool_call>")
    assert second.tail.clean and second.calls == 1 and looked == []
    assert spans.reader_of(HERMES).read("text<tool_call>{}</tool_call>x<th").begun == "span"
    assert looked


@example(text="x<tool_c", name="hermes")  # shorter than the tag, longer than half of it
@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="<[tool_cahinkerspd]>/ x", max_size=20),
    name=st.sampled_from(["hermes", "chatml-brackets"]),
)
def test_a_texts_tail_is_read_from_its_last_characters_alone(text: str, name: str) -> None:
    """The tail kept by a text's last characters is the one its whole reading gives, for texts
    shorter and longer than the longest opening tag."""
    dialect = get_dialect(name)
    want = spans.DialectReader(dialect).tail(text, None, 0)  # a fresh reader: no tail kept
    reader = spans.DialectReader(dialect)
    for cut in range(len(text) + 1):
        reader.tail(text[cut:], None, 0)
    assert reader.tail(text, None, 0) == want
    begun = spans.partial_tag_suffix(text, (dialect.tool_call.begin,))
    spanned = spans.partial_tag_suffix(text, tuple(p.begin for p in dialect.free_spans))
    assert want.begun == ("call" if begun else "span" if spanned else None)
