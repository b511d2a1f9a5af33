"""Grammar drafts (:mod:`hermes_vllm.processor.forced_drafts`): a hosted row whose grammar forces
its next tokens offers them as drafts, spelled as the served tokenizer spells them, and each is
allowed by the row's own mask at its position.

Checked on real tokenizers (SentencePiece's 32k Mistral v1 and the 131k tekken BPE) by feeding a
hosted row the tokenizer's own spelling of a whole call and asking, at every position, for the
forced drafts: they must be the next tokens of that spelling (never a token boundary the model
would not write), and the row's masks must allow them. Then vLLM's own scheduler code (0.32 here,
0.33 / 0.34 under ``make compat``) is run with the wrapped ``update_draft_token_ids``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from support.budget_scenarios import WEATHER
from support.drafts import NGRAM

from hermes_vllm import constraint_args, settings
from hermes_vllm.grammar.engines.base import token_allowed
from hermes_vllm.processor import forced_drafts
from hermes_vllm.processor.core import ConstraintCore

NAMED = {"type": "function", "function": {"name": "get_weather"}}
BOOKING = {
    "type": "function",
    "function": {
        "name": "book_table",
        "parameters": {
            "type": "object",
            "properties": {"restaurant": {"type": "string"}, "party_size": {"type": "integer"}},
            "required": ["restaurant", "party_size"],
            "additionalProperties": False,
        },
    },
}
CALLS = {
    "weather": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "booking": '<tool_call>\n{"name": "book_table", "arguments": {"restaurant": "Chez Nous", "party_size": 4}}\n'
    "</tool_call>",
}
COMPACT = {
    "weather": '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>',
    "booking": '<tool_call>{"name":"book_table","arguments":{"restaurant":"Chez Nous","party_size":4}}</tool_call>',
}


@pytest.fixture
def whitespace(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """``max_call_whitespace`` for the rows built in the test (the default 1, or 0)."""
    monkeypatch.setenv("HERMES_VLLM_MAX_CALL_WHITESPACE", str(request.param))
    settings.get_limits.cache_clear()
    yield request.param
    monkeypatch.undo()
    settings.get_limits.cache_clear()


_HOSTS: dict[tuple[int, int], Any] = {}


def hosted(tokenizer: Any, tools: list[Any], choice: Any) -> Any:
    """A factory of hosted rows for ``tools`` and ``choice`` (one core per tokenizer and
    whitespace setting: loading a vocabulary is the slow part)."""
    from vllm import SamplingParams

    from hermes_vllm.processor.hosted import RowHost

    key = (id(tokenizer), settings.get_limits().max_call_whitespace)
    if key not in _HOSTS:
        _HOSTS[key] = RowHost(ConstraintCore(lambda: tokenizer, len(tokenizer), engine="auto"), window=6)
    host = _HOSTS[key]
    params = SamplingParams(max_tokens=200, extra_args=constraint_args(tools, choice))
    return lambda: host.grammar(params)


def offers(tokenizer: Any, tools: list[Any], choice: Any, text: str) -> tuple[list[int], list[list[int]]]:
    """The tokenizer's spelling of ``text`` and a stop token, and the drafts a row fed that
    spelling offers at each position (each checked against the row's mask there)."""
    row = hosted(tokenizer, tools, choice)()
    ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    width = len(tokenizer)
    bitmask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
    drafts: list[list[int]] = []
    for i, token in enumerate(ids):
        offered = row.forced_drafts(NGRAM["num_speculative_tokens"])
        drafts.append(offered)
        for draft in offered:  # the drafts' own rows, as vLLM's draft path fills them
            row.fill_bitmask(bitmask, 0)
            assert token_allowed(bitmask[0].numpy(), draft), (i, offered)
            assert row.accept_tokens("row", [draft])
        row.rollback(len(offered))
        row.fill_bitmask(bitmask, 0)
        assert row.accept_tokens("row", [token]), (i, token)
    return ids, drafts


@pytest.mark.parametrize("whitespace", [1, 0], indirect=True)
@pytest.mark.parametrize(
    ("tools", "choice", "call"), [([WEATHER], NAMED, "weather"), ([WEATHER, BOOKING], "required", "booking")]
)
def test_forced_drafts_are_the_tokenizers_own_next_tokens_and_the_mask_allows_them(
    any_tokenizer: Any, whitespace: int, tools: list[Any], choice: Any, call: str
) -> None:
    text = (COMPACT if whitespace == 0 else CALLS)[call]
    ids, drafts = offers(any_tokenizer, tools, choice, text)
    for i, offered in enumerate(drafts):
        assert offered == ids[i : i + len(offered)], (i, any_tokenizer.convert_ids_to_tokens(offered))
    begun = next(i for i in range(len(ids)) if any_tokenizer.decode(ids[:i]).endswith(('"get', '"book')))
    assert any(drafts[begun - 1 : begun + 2]), "the rest of the tool's name is forced once begun"


@pytest.mark.parametrize("whitespace", [0], indirect=True)
def test_without_whitespace_the_envelope_is_forced_further(any_tokenizer: Any, whitespace: int) -> None:
    """At ``max_call_whitespace=0`` a named call's envelope is one forced run from its first
    token: more positions offer drafts than under the default whitespace (measured beside)."""
    ids, drafts = offers(any_tokenizer, [WEATHER], NAMED, COMPACT["weather"])
    assert sum(map(len, drafts)) >= len(ids) // 2, drafts


def test_a_run_whose_end_the_model_may_spell_with_what_follows_is_held_back(any_tokenizer: Any) -> None:
    """After ``"city":`` the gap's space and the value's opening quote are the run (the template's
    gap, then the string's quote), but the vocabulary has tokens that begin with that quote and go
    on into a value, so the model may write the quote together with what follows: a draft of it
    would be a boundary the model need not write, so none is offered, though the row's mask allows
    exactly that byte run."""
    ids, drafts = offers(any_tokenizer, [WEATHER], NAMED, CALLS["weather"])
    at = next(i for i in range(len(ids)) if any_tokenizer.decode(ids[:i]).endswith('"city":'))
    quote = any_tokenizer.convert_ids_to_tokens(ids[at])
    assert quote.strip("\u2581\u0120 ") == '"'
    vocabulary = any_tokenizer.convert_ids_to_tokens(list(range(len(any_tokenizer))))
    assert any(t.startswith(quote) and len(t) > len(quote) for t in vocabulary if isinstance(t, str))
    assert drafts[at] == []


@pytest.mark.parametrize("whitespace", [1], indirect=True)
def test_past_a_gap_the_drafts_go_on_in_the_templates_spelling(any_tokenizer: Any, whitespace: int) -> None:
    """Whitespace the grammar allows makes every gap of a call a branch. Where a branch allows only
    whitespace and then a forced run, the drafts take the whitespace the template writes there
    (a newline after the call's tag, a space after ``:``) and go on: a model writing the template's
    spelling gets them as its next tokens; one spacing its calls otherwise gets a guess it refuses,
    each draft still allowed by the row's mask (:func:`offers` checks) and its own token taken."""
    ids, drafts = offers(any_tokenizer, [WEATHER], NAMED, CALLS["weather"])
    for after in ("<tool_call>", '"name":'):
        at = next(i for i in range(len(ids)) if any_tokenizer.decode(ids[:i]).endswith(after))
        assert len(drafts[at]) >= 2 and drafts[at] == ids[at : at + len(drafts[at])], (after, drafts[at])
    compact, guesses = offers(any_tokenizer, [WEATHER], NAMED, COMPACT["weather"])
    at = next(i for i in range(len(compact)) if any_tokenizer.decode(compact[:i]).endswith("<tool_call>"))
    assert guesses[at] and guesses[at][0] != compact[at]


def test_a_byte_forced_run_the_mask_spells_many_ways_is_offered_as_the_tokenizer_spells_it(
    tokenizer: Any,
) -> None:
    """Inside the tool's name the mask allows several tokens (every prefix of the rest of the
    name); the drafts are the tokenizer's own spelling, which is not the shortest-token walk."""
    row = hosted(tokenizer, [WEATHER], NAMED)()
    ids = tokenizer.encode(CALLS["weather"], add_special_tokens=False)
    at = next(i for i in range(len(ids)) if tokenizer.decode(ids[:i]).endswith('"name": "'))
    assert row.accept_tokens("r", ids[:at])
    width = len(tokenizer)
    bitmask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
    row.fill_bitmask(bitmask, 0)
    words = bitmask[0].numpy()
    assert sum(token_allowed(words, t) for t in range(width)) > 1
    assert row.forced_drafts(3) == ids[at : at + 3]
    row.fill_bitmask(bitmask, 0)
    assert torch.equal(bitmask[0], torch.from_numpy(words)), "offering leaves the row where it was"


def test_the_releases_scheduler_takes_the_forced_run_as_the_drafts(tokenizer: Any, tiny_model: Path) -> None:
    """vLLM's own ``Scheduler.update_draft_token_ids`` (whichever release runs), wrapped: a row
    inside a forced run gets it as its drafts in place of the proposer's (a random draft here),
    the structured-output manager masks them, and every one is allowed by its row."""
    from test_speculative import _release_manager
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import DraftTokenIds

    assert forced_drafts.install()
    manager = _release_manager(tiny_model, len(tokenizer))
    row = hosted(tokenizer, [WEATHER], NAMED)()
    ids = tokenizer.encode(CALLS["weather"], add_special_tokens=False)
    at = next(i for i in range(len(ids)) if tokenizer.decode(ids[:i]).endswith('"name": "'))
    assert row.accept_tokens("r", ids[:at])
    request = SimpleNamespace(
        structured_output_request=SimpleNamespace(grammar=row, reasoning_ended=True),
        use_structured_output=True,
        request_id="r",
        spec_token_ids=[],
        is_prefill_chunk=False,
        is_finished=lambda: False,
    )
    scheduler = SimpleNamespace(
        requests={"r": request},
        structured_output_manager=manager,
        num_spec_tokens=NGRAM["num_speculative_tokens"],
    )
    wrong = random.Random(0).randrange(len(tokenizer))
    Scheduler.update_draft_token_ids(scheduler, DraftTokenIds(["r"], [[wrong]]))
    assert request.spec_token_ids == ids[at : at + 3]
    bitmask = manager.grammar_bitmask({"r": request}, ["r"], {"r": request.spec_token_ids})
    for position, draft in enumerate(request.spec_token_ids):
        assert token_allowed(bitmask[position], draft), position


@pytest.mark.engine
def test_forced_runs_as_drafts_take_fewer_engine_steps_per_call_than_vllms_tag() -> None:
    """The demo's trained model (a model that writes its calls: under vLLM's tag a random model
    writes whitespace or a string that never ends), one engine with ngram drafts, the same greedy
    named-tool requests over held-out BFCL questions, each stopped at its call's end tag:
    constrained by ours (grammar drafts on, then off) and by vLLM's structural tag (its ``hermes``
    parser's strict tag). Ours with grammar drafts takes fewer engine steps per schema-valid call
    (the steps that ran the model for a request, summed over the requests) than the tag with the
    same drafter and than ours without grammar drafts, and writes the same text as without them.
    A call is counted only where its arguments are valid: the model writes other calls under the
    tag (an array for an object, keys the tool does not have), so per closed call alone the tag,
    which also skips the model's empty think span, can look cheaper."""
    # In a process of its own: vLLM 0.32 cannot start an engine in a process where an ngram
    # engine already ran (its Triton-override scan trips over the numba that the proposer loaded).
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, test_forced_drafts as t; print('RUNS' + json.dumps(t.named_call_runs()))",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        cwd=Path(__file__).parent,
    )
    assert out.returncode == 0 and "RUNS" in out.stdout, out.stderr[-3000:]
    runs: dict[str, tuple[int, list[str]]] = json.loads(out.stdout.split("RUNS", 1)[1])
    from support.bfcl_judge import calls_from_text, judge

    from hermes_vllm.demo.trained_model import held_out_items

    items = _one_call_items(held_out_items())

    def calls(name: str) -> int:
        """The replies that hold their named call, closed, its arguments valid for the tool's
        schema (a call a client can run: the tag's model writes some that are not)."""
        found = 0
        for item, text in zip(items, runs[name][1], strict=True):
            named = [c for c in calls_from_text(text) if c.name == item.target[0].name]
            found += bool(named) and judge(named, item.schemas, [named[0].name], []).valid
        return found

    assert calls("ours") == len(items), runs["ours"][1]
    ratios = {name: runs[name][0] / calls(name) if calls(name) else float("inf") for name in runs}
    assert ratios["ours"] < ratios["tag"] and ratios["ours"] < ratios["ours, no grammar drafts"], ratios
    assert runs["ours"][1] == runs["ours, no grammar drafts"][1]


def _one_call_items(items: list[Any]) -> list[Any]:
    """The first eight held-out questions that take one call."""
    return [i for i in items if len(i.target) == 1][:8]


def named_call_runs() -> dict[str, tuple[int, list[str]]]:
    """Engine steps (summed over the requests) and replies of the same greedy named-tool requests
    on the trained model with ngram drafts: a warm-up, ours with and without grammar drafts, and
    vLLM's structural tag; each reply stopped at its call's end tag."""
    from support.offline import offline_llm
    from vllm import SamplingParams
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.structural_tag_registry import get_model_structural_tag
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    from hermes_vllm import sampling_options
    from hermes_vllm.demo.trained_model import held_out_items, trained_model_path

    llm = offline_llm(trained_model_path(), speculative_config=NGRAM, max_num_seqs=8)
    tokenizer = llm.get_tokenizer()
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    steps = [0]
    schedule = scheduler.schedule

    def counted(*args: Any, **kwargs: Any) -> Any:
        """Each request's engine steps: the steps that ran the model for it."""
        out = schedule(*args, **kwargs)
        steps[0] += sum(1 for n in out.num_scheduled_tokens.values() if n > 0)
        return out

    scheduler.schedule = counted
    items = _one_call_items(held_out_items())
    prompts = [
        tokenizer.apply_chat_template(i.messages, tools=i.tools, add_generation_prompt=True, tokenize=False)
        for i in items
    ]
    common: dict[str, Any] = {"temperature": 0.0, "max_tokens": 160, "stop": ["</tool_call>"]}

    def params(kind: str, item: Any) -> SamplingParams:
        named = {"type": "function", "function": {"name": item.target[0].name}}
        if kind == "ours":
            return SamplingParams(**common, **sampling_options(tokenizer, item.tools, named))
        chat = ChatCompletionRequest(model="m", messages=item.messages, tools=item.tools, tool_choice=named)
        tag = get_model_structural_tag(
            "hermes", chat.tools, chat.tool_choice, False, ToolStrictLevel.PARAMETER
        )
        assert tag is not None
        outputs = StructuredOutputsParams(structural_tag=json.dumps(tag.model_dump()))
        return SamplingParams(**common, structured_outputs=outputs, skip_special_tokens=False)

    runs: dict[str, tuple[int, list[str]]] = {}
    try:
        for name, drafts in (("warm-up", "1"), ("ours", "1"), ("ours, no grammar drafts", "0"), ("tag", "1")):
            os.environ["HERMES_VLLM_GRAMMAR_DRAFTS"] = drafts
            settings.get_limits.cache_clear()
            steps[0] = 0
            todo = [params("tag" if name == "tag" else "ours", i) for i in items]
            outputs = llm.generate(prompts, todo, use_tqdm=False)
            ended = [
                o.outputs[0].text + ("</tool_call>" if o.outputs[0].stop_reason else "") for o in outputs
            ]
            runs[name] = (steps[0], ended)
    finally:
        os.environ.pop("HERMES_VLLM_GRAMMAR_DRAFTS", None)
        settings.get_limits.cache_clear()

    return runs
