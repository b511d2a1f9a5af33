"""vLLM 0.34's reasoning-end members of our reasoning parser, read by vLLM's structured-output manager,
and an empty ``tools`` list read as no tools, as vLLM 0.34 reads it.

``response_format`` JSON with our reasoning parser must start where our spans say reasoning ended:
after the closing tag of the reasoning span, never at a call tag inside it. vLLM's own
``StructuredOutputManager`` is driven here without an engine (its methods only read the request,
the reasoning parser and the grammar); the grammar records what vLLM feeds it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.reasoning.abs_reasoning_parsers import ReasoningParser
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.structured_output.backend_types import StructuredOutputGrammar
from vllm.v1.structured_output.request import StructuredOutputRequest

from hermes_vllm.constraint import ARGS_KEY
from hermes_vllm.dialect import get_dialect
from hermes_vllm.parsers import PARSERS, dialects, parser_class_names
from hermes_vllm.parsers.dialects import HermesReasoningParser, HermesToolParser
from hermes_vllm.parsers.reasoning_parser import DialectReasoningParser
from hermes_vllm.spans import split_spans
from hermes_vllm.testing import tiny_model_path
from hermes_vllm.vocabulary import served_vocabulary

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
MEMBERS_IN_BASE = hasattr(ReasoningParser, "find_reasoning_end")
"""vLLM 0.34 declares the members on every reasoning parser and its manager reads them from ours;
0.32's manager reads them only from vLLM's own engine-based parsers."""

PROMPT_OPENS = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
PROMPT_PLAIN = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
JSON = '{"a": 1}'


def spell(tokenizer: Any, text: str) -> list[int]:
    """``text`` in tokens, greedily longest first: a closing tag that is one token comes out whole."""
    speller = served_vocabulary(tokenizer).speller
    ids: list[int] = []
    rest = text.encode().decode("latin-1")
    while rest:
        token = speller.prefixes(rest)[0]
        ids.append(token)
        rest = rest[len(served_vocabulary(tokenizer).vocab.latin1[token]) :]
    return ids


def in_pieces(tokenizer: Any, tag: str) -> list[int]:
    """``tag`` in two or more tokens, none of them the tag's own: how a model may still write it."""
    return [t for part in (tag[:2], tag[2:-1], tag[-1:]) for t in spell(tokenizer, part)]


class Recorder(StructuredOutputGrammar):  # type: ignore[misc]
    """A grammar that takes every token vLLM feeds it and refuses any token as its first one
    (as a JSON grammar refuses a tag), so implicit reasoning ends would be masked."""

    def __init__(self) -> None:
        self.fed: list[int] = []

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        self.fed += tokens
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        return []

    def rollback(self, num_tokens: int) -> None:
        del self.fed[len(self.fed) - num_tokens :]

    def fill_bitmask(self, bitmask: Any, batch_index: int) -> None:
        raise AssertionError("not asked here")

    def is_terminated(self) -> bool:
        return False

    def reset(self) -> None:
        self.fed = []


class Row:
    """The parts of vLLM's ``Request`` the structured-output manager reads."""

    request_id = "row"
    use_structured_output = True

    def __init__(self, prompt: list[int]) -> None:
        self.prompt_token_ids = prompt
        self._all_token_ids = list(prompt)
        self.grammar = Recorder()
        self.structured_output_request = StructuredOutputRequest(
            params=StructuredOutputsParams(json={"type": "object"})
        )
        self.structured_output_request.grammar = self.grammar

    @property
    def all_token_ids(self) -> list[int]:
        return self._all_token_ids


def manager(tokenizer: Any, reasoner_cls: type[ReasoningParser]) -> StructuredOutputManager:
    """vLLM's manager with what its reasoning gate reads (its constructor wants a whole engine
    config, which 0.34 refuses to build on an x86 CPU without Triton)."""
    m = StructuredOutputManager.__new__(StructuredOutputManager)
    m.enable_in_reasoning = False
    m.reasoner_cls = reasoner_cls
    m.tokenizer = tokenizer
    return m


def counting(base: type[DialectReasoningParser]) -> tuple[type[DialectReasoningParser], list[int]]:
    """``base`` with its whole-output reads (``is_reasoning_end``) counted."""
    reads: list[int] = []

    def is_reasoning_end(self: DialectReasoningParser, input_ids: Sequence[int]) -> bool:
        reads.append(len(input_ids))
        return base.is_reasoning_end(self, input_ids)

    return type("Counting", (base,), {"is_reasoning_end": is_reasoning_end}), reads


def expected_content(tokenizer: Any, opened: bool, output: list[int]) -> list[int]:
    """The tokens after the one completing the first reasoning span's closing tag, by our spans."""
    pieces = served_vocabulary(tokenizer).vocab.latin1
    opener = "<think>" if opened else ""
    text = opener + "".join(pieces[t] for t in output)
    first = next(s for s in split_spans(text, "hermes") if s.kind == "reasoning")
    assert first.closed
    written = len(opener)
    for i, token in enumerate(output):
        written += len(pieces[token])
        if written >= first.end:
            return output[i + 1 :]
    raise AssertionError("the span closes after the output")


def steps(output: list[int], split: str, closing: int) -> list[list[int]]:
    """The output as vLLM commits it: a token a step, a few at a time (accepted drafts), or a token
    a step until three before the closing tag at ``closing``, then the rest at once."""
    if split == "one":
        return [[t] for t in output]
    if split == "drafts at the end":
        cut = max(closing - 3, 0)
        return [[t] for t in output[:cut]] + [output[cut:]]
    rng, out, i = random.Random(len(output)), [], 0
    while i < len(output):
        n = rng.randint(1, 4)
        out.append(output[i : i + n])
        i += n
    return out


OUTPUTS: dict[str, tuple[bool, Callable[[Any], list[int]]]] = {
    # (the prompt opens the span, the output)
    "prompt-opened": (True, lambda t: spell(t, "I should answer.\n</think>\n\n" + JSON)),
    "call tag inside": (
        True,
        lambda t: spell(t, 'so <tool_call>{"name": "f"}</tool_call> then why</think>' + JSON),
    ),
    "tag in pieces": (True, lambda t: spell(t, "ok, done") + in_pieces(t, "</think>") + spell(t, JSON)),
    "model-opened": (False, lambda t: spell(t, "<think>hm, let me see</think>" + JSON)),
    "stray closing tag first": (False, lambda t: spell(t, "x y z</think> <think>r s t</think>" + JSON)),
}


@pytest.fixture(scope="module", params=["mistral-v1", "llama3.1"])
def engine_tokenizer(request: pytest.FixtureRequest) -> Any:
    """The tokenizer vLLM's engine loads: ``</think>`` a plain added token (Mistral v1) or a
    special one (Llama 3.1, Hermes 3's tags on special slots)."""
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(tiny_model_path(request.param)))


@pytest.mark.parametrize("case", sorted(OUTPUTS))
@pytest.mark.parametrize("split", ["one", "random", "drafts at the end"])
def test_vllms_structured_output_starts_where_our_spans_end_reasoning(
    case: str, split: str, engine_tokenizer: Any
) -> None:
    """vLLM's manager, fed the output step by step, hands the grammar exactly the tokens after the
    closing tag of the first reasoning span, never a call tag inside it; a closing tag with no
    opening is text. On vLLM 0.34 a step whose bytes cannot close a span (no ``>``) is answered
    by our ``find_reasoning_end`` from its own tokens, where before the manager read the whole
    output at every step; and no call tag is masked while the row reasons."""
    opened, build = OUTPUTS[case]
    prompt = spell(engine_tokenizer, PROMPT_OPENS if opened else PROMPT_PLAIN)
    output = build(engine_tokenizer)
    content = expected_content(engine_tokenizer, opened, output)
    reasoner_cls, reads = counting(HermesReasoningParser)
    m, row = manager(engine_tokenizer, reasoner_cls), Row(prompt)
    pieces = served_vocabulary(engine_tokenizer).vocab.latin1
    quiet_reads: list[int] = []  # whole-output reads at reasoning steps that cannot close a span
    for step in steps(output, split, len(output) - len(content) - 1):
        ended, before = row.structured_output_request.reasoning_ended, len(reads)
        row._all_token_ids += step
        assert m.accept_tokens(row, step)
        if not ended and ">" not in "".join(pieces[t] for t in step):
            quiet_reads.append(sum(n != len(prompt) for n in reads[before:]))
    assert row.grammar.fed == content
    assert row.structured_output_request.reasoning_ended
    assert quiet_reads, "the split must hold reasoning steps that cannot close a span"
    if not MEMBERS_IN_BASE:
        pytest.skip("the rest is vLLM 0.34's: this release's manager reads our ends by is_reasoning_end only")
    assert quiet_reads == [0] * len(quiet_reads)
    assert m._masked_reasoning_ends(row) == ()


@pytest.mark.parametrize("family", ["mistral-v1", "llama3.1", "qwen2.5"])
@pytest.mark.parametrize("name", sorted(PARSERS))
def test_the_reasoning_end_members_follow_the_turn_grammar(name: str, family: str) -> None:
    """The closing tag ends reasoning; it is an id only where the vocabulary has it as one token,
    plain added (Mistral v1 here) or special (Llama 3.1 here); where it is several (the bracket
    dialect, Qwen 2.5's ``</think>``) vLLM falls back to reading the output; no call tag ends
    reasoning, even where it is one token; tokens that may complete a closing tag are left to the
    whole-output read, since only the text before them tells whether they close a span."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path(family)))
    parser = getattr(dialects, parser_class_names(name)[1])(tokenizer)
    dialect = get_dialect(PARSERS[name])
    end = dialect.reasoning[0].end
    one_token = tokenizer.get_vocab().get(end)
    assert parser.reasoning_end_token_ids == (
        frozenset({one_token}) if one_token is not None else frozenset()
    )
    several = family == "qwen2.5" or name == "hermes_vllm_brackets"
    assert several == (not parser.reasoning_end_token_ids)
    assert not parser.implicit_reasoning_end_token_ids
    plain = spell(tokenizer, "no tag here " + dialect.tool_call.begin)
    assert tuple(parser.find_reasoning_end(plain)) == (len(plain), False)
    assert parser.find_reasoning_end([]) == (0, False)
    for ids in (
        spell(tokenizer, "a" + end + "b"),
        in_pieces(tokenizer, end),
        spell(tokenizer, end[3:] + "x"),
    ):
        assert parser.find_reasoning_end(ids) is None, served_vocabulary(tokenizer).vocab.latin1[ids[0]]


def constructed(**fields: Any) -> ChatCompletionRequest:
    """A request built without vLLM's validation, which reads ``tools: []`` per release."""
    return ChatCompletionRequest.model_construct(
        model="tiny", messages=[{"role": "user", "content": "hi"}], **fields
    )


@pytest.mark.parametrize("tool_choice", ["auto", "required", "none", None])
def test_an_empty_tools_list_is_no_tools(tool_choice: Any, vllm_tokenizer: Any) -> None:
    """As vLLM 0.34 reads ``tools: []``: ``auto`` and ``required`` become ``none`` with no tools,
    so no constraint is built and no call is owed, the same as a request without ``tools``; a
    named tool names none of them (HTTP 400)."""
    parser = HermesToolParser(vllm_tokenizer)
    request = parser.adjust_request(constructed(tools=[], tool_choice=tool_choice))
    omitted = parser.adjust_request(constructed(tool_choice="none" if tool_choice else None))
    assert request.tools is None and ARGS_KEY not in (request.vllm_xargs or {})
    assert request.tool_choice == omitted.tool_choice
    assert request.vllm_xargs == omitted.vllm_xargs
    with pytest.raises(ValueError, match="names a tool"):
        parser.adjust_request(constructed(tools=[], tool_choice=NAMED))
    # A request with its tools still gets its constraint.
    assert ARGS_KEY in (
        parser.adjust_request(constructed(tools=[WEATHER], tool_choice="required")).vllm_xargs or {}
    )
    if not MEMBERS_IN_BASE:
        pytest.skip("the rest compares with vLLM 0.34's own validation; earlier releases refuse tools: []")
    validated = ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": "hi"}], tools=[], tool_choice=tool_choice
    )
    assert (validated.tools, validated.tool_choice) == (request.tools, request.tool_choice)
    assert ARGS_KEY not in (parser.adjust_request(validated).vllm_xargs or {})
