"""The completer's and the speller's per-text caches: a kept answer is the answer a fresh object
computes, for every prefix of BFCL calls, and never one kept for another text or measure."""

from __future__ import annotations

from typing import Any

from support.corpus import UNSATISFIABLE_BFCL_TOOL, bfcl_functions

from hermes_vllm.budget import CallCompleter, Speller
from hermes_vllm.demo.bfcl import as_openai_tool
from hermes_vllm.dialect import get_dialect
from hermes_vllm.schema import normalize_tool

DIALECT = get_dialect("hermes")
TOOLS = 12


def _tools() -> list[tuple[str, Any]]:
    functions = [f for name, f in sorted(bfcl_functions().items()) if name != UNSATISFIABLE_BFCL_TOOL]
    out = []
    for function in functions[:: len(functions) // TOOLS][:TOOLS]:
        spec = normalize_tool(as_openai_tool(function))
        out.append((spec.name, spec.parameters))
    return out


def test_cached_completions_equal_fresh_ones_over_every_prefix_of_bfcl_calls() -> None:
    tools = _tools()
    cached = CallCompleter(DIALECT, tools)
    for name, parameters in tools:
        call = CallCompleter(DIALECT, [(name, parameters)]).shortest_call()
        assert call is not None
        for _ in range(2):  # the second pass is answered from the cache
            for end in range(len(call) + 1):
                fresh = CallCompleter(DIALECT, tools).complete(call[:end])
                assert cached.complete(call[:end]) == fresh, (name, call[:end])


def test_a_completion_is_kept_per_text_and_per_measure() -> None:
    tools = [("pick", {"type": "object", "properties": {"v": {"enum": ["bbbb", "a"]}}, "required": ["v"]})]
    completer = CallCompleter(DIALECT, tools)

    def costly_a(text: str) -> int:
        return len(text) + 100 * text.count("a")

    call = '<tool_call>{"name": "pick", "arguments": {"v": '
    by_length = completer.complete(call)
    by_cost = completer.complete(call, costly_a)
    assert by_length is not None and '"a"' in by_length
    assert by_cost is not None and '"bbbb"' in by_cost
    assert completer.complete(call + '"b') == CallCompleter(DIALECT, tools).complete(call + '"b')
    assert completer.complete(call + '"b') != by_length


def test_cached_token_counts_equal_fresh_ones() -> None:
    pieces = ["a", "b", "ab", "abc", "c", '"', "}"]
    speller = Speller(pieces)
    for text in ["abc", "ab", "abcabc", '"}', "x", "abc"]:
        assert speller.count(text) == Speller(pieces).count(text), text
    assert speller.tokens("abc") == 1 and speller.count("abx") is None


def test_cached_prefix_tokens_equal_fresh_ones_past_the_longest_token() -> None:
    """Prefix tokens are kept per the text's first ``longest`` characters: texts that differ only
    after them share an answer, texts that differ at the last of them do not."""
    pieces = ["a", "ab", "abc", "b", "bc", "c"]
    speller = Speller(pieces)  # longest token: 3 characters
    for text in ["abcx", "abcy", "abx", "ab", "abc", "b", "bcab", "x", ""]:
        for _ in range(2):
            assert speller.prefixes(text) == Speller(pieces).prefixes(text), text
    assert speller.prefixes("abcx") == (2, 1, 0) and speller.prefixes("abx") == (1, 0)
