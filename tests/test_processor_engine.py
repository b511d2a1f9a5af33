"""The processor inside a real offline vLLM engine on the tiny random model.

A random model samples garbage at temperature 1.0; every call it produces under the constraint
must still parse and validate against its tool's schema. Requests without tools in the same batch
must come out exactly as they do when no request is constrained.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hermes_vllm import constraint_args, get_dialect
from hermes_vllm.demo.bias import call_bias
from hermes_vllm.schema import normalize_tool
from hermes_vllm.spans import split_spans

pytestmark = pytest.mark.engine

PROMPT = "<|im_start|>system\nYou call tools.<|im_end|>\n<|im_start|>user\nPlease help.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def llm(tiny_model: Path) -> Any:
    from support.offline import offline_llm

    return offline_llm(tiny_model, disable_log_stats=False)  # get_metrics() needs stats


def bfcl_tool_sets(count: int) -> list[list[dict[str, Any]]]:
    """``count`` tool sets spread over the multi-tool BFCL files."""
    from support.corpus import bfcl_files, load_bfcl

    files = [f for f in bfcl_files() if "multiple" in f.name]
    sets = [case.tools for path in files for case in load_bfcl(path)]
    return sets[:: max(1, len(sets) // count)][:count]


def parse_calls(text: str, dialect: str, finished: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """The calls in ``text``; ``finished=False`` tolerates a last call cut by max_tokens."""
    calls = []
    for span in split_spans(text, dialect):
        if span.kind == "call":
            if not span.closed and not finished:
                continue
            assert span.closed, f"unfinished call in {text[:200]!r}"
            payload = json.loads(span.body)
            calls.append((payload["name"], payload["arguments"]))
    return calls


def test_batch_of_bfcl_tool_sets_yields_only_schema_valid_calls(llm: Any, tokenizer: Any) -> None:
    from vllm import SamplingParams

    tool_sets = bfcl_tool_sets(36)
    bias = call_bias(tokenizer, ("hermes", "chatml-brackets"))
    requests = []
    for i, tools in enumerate(tool_sets):
        dialect = ("hermes", "chatml-brackets", "qwen")[i % 3]
        choice: Any = "required"
        if i % 2:
            choice = {"type": "function", "function": {"name": tools[-1]["name"]}}
        args = constraint_args(tools, choice, parallel_tool_calls=bool(i % 4 < 2), dialect=dialect)
        requests.append((tools, choice, dialect, args))
    params = [
        SamplingParams(
            temperature=1.0,
            seed=i,
            max_tokens=500,
            logit_bias=bias,
            extra_args=args,
            skip_special_tokens=False,
        )
        for i, (_, _, _, args) in enumerate(requests)
    ]
    outputs = llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    total = 0
    for (tools, choice, dialect, _), out in zip(requests, outputs, strict=True):
        text = out.outputs[0].text
        # Only max_tokens may leave a (parallel) call unfinished; EOS is masked inside a call.
        calls = parse_calls(text, dialect, finished=out.outputs[0].finish_reason != "length")
        assert calls, f"tool_choice={choice!r} must produce a call; got {text[:300]!r}"
        schemas = {spec.name: spec.parameters for spec in (normalize_tool(t, i) for i, t in enumerate(tools))}
        for name, arguments in calls:
            assert name in schemas
            if isinstance(choice, dict):
                assert name == choice["function"]["name"]
            jsonschema.validate(arguments, schemas[name])
            total += 1
        # The free text outside calls never holds a stray call tag.
        begin = get_dialect(dialect).tool_call.begin
        assert all(begin not in s.body for s in split_spans(text, dialect) if s.kind == "text")
    assert total >= len(requests)


def test_requests_without_tools_are_untouched(llm: Any, tokenizer: Any) -> None:
    """Same batch twice, constraints on and off for the tool rows: the plain rows must not change."""
    from vllm import SamplingParams

    tools = bfcl_tool_sets(4)
    bias = call_bias(tokenizer, ("hermes", "chatml-brackets"))

    def batch(constrained: bool) -> list[str]:
        params = []
        for i in range(8):
            extra = constraint_args(tools[i % 4], "required") if (i % 2 and constrained) else None
            params.append(
                SamplingParams(
                    temperature=1.0,
                    seed=100 + i,
                    max_tokens=64,
                    ignore_eos=True,
                    logit_bias=bias,
                    extra_args=extra,
                )
            )
        return [o.outputs[0].text for o in llm.generate([PROMPT] * 8, params, use_tqdm=False)]

    on, off = batch(True), batch(False)
    assert [on[i] for i in range(0, 8, 2)] == [off[i] for i in range(0, 8, 2)]
    assert [on[i] for i in range(1, 8, 2)] != [off[i] for i in range(1, 8, 2)], "the constraint did nothing"


def test_auto_mode_leaves_free_text_alone_until_a_call_opens(llm: Any, tokenizer: Any) -> None:
    from vllm import SamplingParams

    tools = bfcl_tool_sets(2)[0]
    bias = call_bias(tokenizer)
    params = [
        SamplingParams(
            temperature=1.0,
            seed=s,
            max_tokens=400,
            logit_bias=bias,
            extra_args=constraint_args(tools),
            skip_special_tokens=False,
        )
        for s in range(8)
    ]
    texts = [o.outputs[0].text for o in llm.generate([PROMPT] * 8, params, use_tqdm=False)]
    schemas = {spec.name: spec.parameters for spec in (normalize_tool(t, i) for i, t in enumerate(tools))}
    calls = [c for t in texts for c in parse_calls(t, "hermes", finished=False)]
    assert calls, "with the call token favoured, some request must have called a tool"
    for name, arguments in calls:
        jsonschema.validate(arguments, schemas[name])


def _ours(llm: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Our series in ``llm.get_metrics()``: a counter's or gauge's value, a histogram's count."""
    return {
        (m.name, tuple(sorted(m.labels.items()))): float(getattr(m, "value", getattr(m, "count", 0)))
        for m in llm.get_metrics()
        if m.name.startswith("hermes_vllm:")
    }


def test_offline_get_metrics_holds_our_series(llm: Any, tokenizer: Any) -> None:
    """``vllm.LLM(...).get_metrics()`` returns the hermes_vllm: series as vLLM returns its own
    (a counter under its family's name), moved by exactly what was generated and refused."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    from hermes_vllm.budget import MARK

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    required = constraint_args(tools, "required", parallel_tool_calls=False)
    before = _ours(llm)
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=200, logit_bias=call_bias(tokenizer),
                       extra_args=required, skip_special_tokens=False)
        for s in range(2)
    ] + [SamplingParams(max_tokens=4, extra_args=constraint_args(tools), skip_special_tokens=False)]  # fmt: skip
    texts = [o.outputs[0].text for o in llm.generate([PROMPT] * 3, params, use_tqdm=False)]
    with pytest.raises(VLLMValidationError, match="max_tokens=1 cannot hold"):
        llm.generate([PROMPT], SamplingParams(max_tokens=1, extra_args=required), use_tqdm=False)
    moved = {k: v - before.get(k, 0.0) for k, v in _ours(llm).items()}
    closed = sum(t.count(MARK) for t in texts)
    assert {k: v for k, v in moved.items() if v and "seconds" not in k[0] and "rows" not in k[0]} == {
        k: v
        for k, v in {
            ("hermes_vllm:requests", (("dialect", "hermes"), ("tool_choice", "required"))): 2.0,
            ("hermes_vllm:requests", (("dialect", "hermes"), ("tool_choice", "auto"))): 1.0,
            ("hermes_vllm:calls", (("outcome", "complete"),)): 2.0 - closed,
            ("hermes_vllm:calls", (("outcome", "budget_closed"),)): float(closed),
            ("hermes_vllm:refused_requests", (("reason", "budget_too_small"),)): 1.0,
            ("hermes_vllm:grammar_cache_hits", ()): moved.get(("hermes_vllm:grammar_cache_hits", ()), 0.0),
            ("hermes_vllm:grammar_cache_misses", ()): 3.0
            - moved.get(("hermes_vllm:grammar_cache_hits", ()), 0.0),
        }.items()
        if v
    }
    assert moved[("hermes_vllm:step_seconds", ())] >= 3


def chat_prompt(
    tokenizer: Any, tools: list[dict[str, Any]], template: str | None = None, **kwargs: Any
) -> str:
    """The generation prompt ``tokenizer``'s chat template (or ``template``) renders for one user turn."""
    messages = [{"role": "user", "content": "Please help."}]
    prompt: str = tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True, **kwargs
    )
    return prompt


@pytest.fixture(scope="module")
def llm_llama31(tiny_model_llama31: Path) -> Any:
    from support.offline import offline_llm

    return offline_llm(tiny_model_llama31)


def test_special_tag_replies_parse_with_sampling_options(llm_llama31: Any) -> None:
    """Hermes 3 has its call tags on special slots: vLLM's default ``skip_special_tokens=True``
    would strip them (no reply would parse); ``sampling_options`` keeps them. The test is about
    the text, not about which opening the model takes: the call tag is favoured (unfavoured, the
    random model spells ``<think>`` out of allowed pieces as often and thinks until max_tokens)."""
    from vllm import SamplingParams

    from hermes_vllm import sampling_options

    llm = llm_llama31
    tok = llm.get_tokenizer()
    tool_sets = bfcl_tool_sets(4)
    bias = call_bias(tok, ("hermes",))
    params = [
        SamplingParams(
            temperature=1.0, max_tokens=500, logit_bias=bias, **sampling_options(tok, tools, "required")
        )
        for i, tools in enumerate(tool_sets)
    ]
    prompts = [chat_prompt(tok, tools) for tools in tool_sets]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for tools, out in zip(tool_sets, outputs, strict=True):
        text = out.outputs[0].text
        calls = parse_calls(text, "hermes", finished=out.outputs[0].finish_reason != "length")
        assert calls, f"no call in {text[:300]!r}"
        schemas = {s.name: s.parameters for s in (normalize_tool(t, i) for i, t in enumerate(tools))}
        for name, arguments in calls:
            jsonschema.validate(arguments, schemas[name])


def test_special_tags_without_skip_special_tokens_false_are_refused(llm_llama31: Any) -> None:
    """``constraint_args`` alone keeps vLLM's ``skip_special_tokens=True``: on Hermes 3's tokenizer
    no call could be read, so the request is refused, saying what to set; the engine keeps serving."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    from hermes_vllm import sampling_options

    tools = bfcl_tool_sets(1)[0]
    with pytest.raises(VLLMValidationError, match=r"<tool_call>.*skip_special_tokens=False"):
        llm_llama31.generate([PROMPT], SamplingParams(max_tokens=4, extra_args=constraint_args(tools)))
    options = sampling_options(llm_llama31.get_tokenizer(), tools)
    assert options["skip_special_tokens"] is False
    (out,) = llm_llama31.generate([PROMPT], SamplingParams(max_tokens=4, **options), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 4


@pytest.fixture(scope="module")
def llm_qwen3(tiny_model_qwen3: Path) -> Any:
    """Module-scoped like the others: an engine freed mid-module tears down the process-wide
    parallel state the engines still alive need."""
    from support.offline import offline_llm

    return offline_llm(tiny_model_qwen3)


def test_qwen3_replies_are_schema_valid_under_its_own_template_and_ours(llm_qwen3: Any) -> None:
    """Qwen 3's tokenizer (151,936-wide logits, plain-token tags) behind Qwen 3's own template and
    our ``qwen`` one, with and without thinking. The call tag is favoured as in the tests above:
    this one is about the tokenizer and the templates, not about which opening a random model
    takes (unfavoured, it spells ``<think>`` from allowed pieces and thinks until max_tokens)."""
    from vllm import SamplingParams

    from hermes_vllm import sampling_options
    from hermes_vllm.formats.chat_template import chat_template

    llm = llm_qwen3
    tok = llm.get_tokenizer()
    tool_sets = bfcl_tool_sets(8)
    bias = call_bias(tok, ("qwen",))
    prompts, params, choices = [], [], []
    for i, tools in enumerate(tool_sets):
        template = None if i % 2 else chat_template("qwen")
        prompts.append(chat_prompt(tok, tools, template, enable_thinking=bool(i % 4 < 2)))
        choice: Any = "required" if i % 3 else {"type": "function", "function": {"name": tools[0]["name"]}}
        choices.append(choice)
        options = sampling_options(tok, tools, choice, dialect="qwen")
        assert "skip_special_tokens" not in options  # Qwen's tags are plain added tokens
        params.append(SamplingParams(temperature=1.0, max_tokens=500, logit_bias=bias, **options))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    vocab = len(tok)
    for tools, choice, out in zip(tool_sets, choices, outputs, strict=True):
        assert max(out.outputs[0].token_ids) < vocab, "a padding id was sampled"
        text = out.outputs[0].text
        calls = parse_calls(text, "qwen", finished=out.outputs[0].finish_reason != "length")
        assert calls, f"no call in {text[:300]!r}"
        schemas = {s.name: s.parameters for s in (normalize_tool(t, i) for i, t in enumerate(tools))}
        for name, arguments in calls:
            if isinstance(choice, dict):
                assert name == choice["function"]["name"]
            jsonschema.validate(arguments, schemas[name])
