"""Constrained tool calls under speculative decoding (ngram drafts on the V1 CPU runner).

The row is hosted as vLLM's structured-output grammar (:mod:`hermes_vllm.processor.hosted`), so
vLLM's scheduler validates, masks and rolls back the drafts. No request here carries a logit bias
(vLLM refuses one with drafts): the budgets alone must deliver the calls.
"""

from __future__ import annotations

import gc
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
import torch
from support.budget_scenarios import WEATHER as TOOL
from support.drafts import COPYABLE_PROMPT as PROMPT
from support.drafts import NGRAM
from support.soundness import tool

from hermes_vllm import constraint_args
from hermes_vllm.grammar.engines.base import token_allowed
from hermes_vllm.processor import handshake, speculative
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.spans import split_spans

CITY = TOOL["function"]["parameters"]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
TURN = '<think>hmm</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call> Bye.'


def requests() -> list[dict[str, Any]]:
    """``auto``, ``required`` and named turns, each with a tight and a roomy ``max_tokens``, plus a
    reasoning budget and a stop string."""
    out: list[dict[str, Any]] = []
    for choice in ("auto", "required", NAMED):
        for max_tokens in (34, 120):  # 34: the shortest call and its mark (31) plus 3
            out.append({"extra_args": constraint_args([TOOL], choice), "max_tokens": max_tokens})
    budgeted = constraint_args([TOOL], "required", reasoning_budget=4)
    out.append({"extra_args": budgeted, "max_tokens": 80})
    out.append({"extra_args": constraint_args([TOOL], "required"), "max_tokens": 80, "stop": ["Paris"]})
    return out


def generate(llm: Any) -> list[tuple[str, list[int]]]:
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, skip_special_tokens=False, **r) for r in requests()]
    outputs = llm.generate([PROMPT] * len(params), params, use_tqdm=False)
    return [(o.outputs[0].text, list(o.outputs[0].token_ids)) for o in outputs]


def counter(llm: Any, name: str) -> int:
    return sum(int(getattr(m, "value", 0)) for m in llm.get_metrics() if m.name == name)


@pytest.fixture(scope="module")
def runs(tiny_model: Path) -> dict[str, Any]:
    """The same greedy requests without drafts, then with ngram drafts (engines built one after
    the other: the frontend routes constrained requests by the engines announced in this process)."""
    from support.offline import offline_llm

    plain = offline_llm(tiny_model)
    reference = generate(plain)
    del plain
    gc.collect()
    llm = offline_llm(tiny_model, speculative_config=NGRAM, disable_log_stats=False)
    try:
        looks = ("hermes_vllm:grammar_cache_hits", "hermes_vllm:grammar_cache_misses")
        before = sum(counter(llm, name) for name in looks)
        drafted = generate(llm)
        accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
        drafts = counter(llm, "vllm:spec_decode_num_draft_tokens")
        cache = sum(counter(llm, name) for name in looks) - before
        yield {
            "reference": reference, "drafted": drafted, "accepted": accepted, "drafts": drafts,
            "cache": cache, "llm": llm,
        }  # fmt: skip
    finally:
        (handshake.ensure_dir() / f"{speculative.RUNNER}-{os.getpid()}.json").unlink(missing_ok=True)


def calls(text: str) -> list[dict[str, Any]]:
    out = []
    for span in split_spans(text, "hermes"):
        if span.kind == "call":
            assert span.closed, f"unfinished call in {text!r}"
            out.append(json.loads(span.body))
    return out


@pytest.mark.engine
def test_drafted_calls_are_valid_and_required_turns_get_theirs(runs: dict[str, Any]) -> None:
    for request, (text, _) in zip(requests(), runs["drafted"], strict=True):
        found = calls(text.replace(" [closed by max_tokens]", ""))
        for call in found:
            assert call["name"] == "get_weather"
            jsonschema.validate(call["arguments"], CITY)
        if json.loads(request["extra_args"]["hermes_vllm"])["tool_choice"] != "auto":
            assert found, f"no call under {request}: {text!r}"
        if request.get("stop"):
            assert all("Paris" not in c["arguments"]["city"] for c in found)


@pytest.mark.engine
def test_drafts_are_accepted_and_greedy_text_is_the_text_without_drafts(runs: dict[str, Any]) -> None:
    assert runs["drafts"] > 0 and runs["accepted"] > 0, runs
    assert [t for t, _ in runs["drafted"]] == [t for t, _ in runs["reference"]]


@pytest.mark.engine
def test_each_drafted_request_is_one_grammar_cache_hit_or_miss(runs: dict[str, Any]) -> None:
    """A hosted row's admission starts its compile before it takes the host's lock, then admits:
    the request is still one look at the grammar cache, as on the plain path (``/metrics``)."""
    assert runs["cache"] == len(requests()), runs["cache"]


@pytest.mark.engine
def test_one_params_object_serves_several_prompts(runs: dict[str, Any]) -> None:
    """vLLM rewrites the marker of a params object sent again (choice -> grammar): still ours."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=40, extra_args=constraint_args([TOOL], "required"))
    outputs = runs["llm"].generate([PROMPT] * 3, params, use_tqdm=False)
    for output in outputs:
        found = calls(output.outputs[0].text.replace(" [closed by max_tokens]", ""))
        assert found and all(c["name"] == "get_weather" for c in found), output.outputs[0].text


@pytest.mark.engine
def test_a_constrained_request_cannot_also_ask_for_structured_outputs(runs: dict[str, Any]) -> None:
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import StructuredOutputsParams

    params = SamplingParams(
        max_tokens=40,
        extra_args=constraint_args([TOOL], "required"),
        structured_outputs=StructuredOutputsParams(json={"type": "object"}),
    )
    with pytest.raises(VLLMValidationError, match=r"together with structured_outputs\.json"):
        runs["llm"].generate([PROMPT], [params], use_tqdm=False)


def scripted(grammar: Any, script: list[int], width: int, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy-like run without drafts: each step takes the script's token where the mask allows
    it, else the lowest allowed token; the mask before each token, and one after the last."""
    tokens: list[int] = []
    masks: list[torch.Tensor] = []
    bitmask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
    for step in range(steps + 1):
        grammar.fill_bitmask(bitmask, 0)
        masks.append(bitmask[0].clone())
        if step == steps:
            break
        want = script[step % len(script)]
        words = bitmask[0].numpy()
        token = (
            want if token_allowed(words, want) else next(t for t in range(width) if token_allowed(words, t))
        )
        assert grammar.accept_tokens("plain", [token])
        tokens.append(token)
    return tokens, masks


def plain_run(
    tokenizer: Any, choice: str, max_tokens: int
) -> tuple[Callable[[], Any], int, int, list[int], list[torch.Tensor]]:
    """A hosted row factory for ``choice`` within ``max_tokens``, the logits width, the steps, and
    the plain run (no drafts) of :data:`TURN` through one row: its tokens and the mask before each."""
    from vllm import SamplingParams

    from hermes_vllm.processor.hosted import RowHost

    width = len(tokenizer)
    host = RowHost(ConstraintCore(lambda: tokenizer, width, engine="auto"), window=4)
    args = constraint_args([TOOL], choice)

    def grammar() -> Any:
        return host.grammar(SamplingParams(max_tokens=max_tokens, extra_args=args))

    steps = max_tokens - 1
    tokens, masks = scripted(grammar(), tokenizer.encode(TURN, add_special_tokens=False), width, steps)
    return grammar, width, steps, tokens, masks


@pytest.mark.parametrize(("choice", "max_tokens"), [("auto", 60), ("required", 24), ("required", 120)])
def test_drafts_rolled_back_leave_the_row_as_if_only_the_kept_tokens_came(
    tokenizer: Any, choice: str, max_tokens: int
) -> None:
    """vLLM's draft protocol against a row fed without drafts: validate, fill and accept each
    draft, fill the bonus row, roll back, accept the kept tokens. Every mask the drafted row gives
    at a kept position equals the plain row's there, budgets (forcing a close at max_tokens=24 under ``required``)
    included; a draft the grammar refuses is cut, and the plain row's mask refuses it too."""
    grammar, width, steps, tokens, masks = plain_run(tokenizer, choice, max_tokens)
    drafted = grammar()
    rng = random.Random(0)
    bitmask = torch.zeros((5, (width + 31) // 32), dtype=torch.int32)
    i = cut = 0
    while i < steps:
        drafts = tokens[i : i + rng.randint(0, 3)]
        if drafts and rng.random() < 0.5:
            drafts[rng.randrange(len(drafts))] = rng.randrange(width)  # a wrong draft
        valid = drafted.validate_tokens(list(drafts))
        assert valid == drafts[: len(valid)]
        if len(valid) < len(drafts):
            cut += 1
            position = i + len(valid)
            if drafts[: len(valid)] == tokens[i:position]:  # the plain row's mask there refuses it
                assert not token_allowed(masks[position].numpy(), drafts[len(valid)])
        for j, token in enumerate(valid):
            drafted.fill_bitmask(bitmask, j)
            assert drafted.accept_tokens("drafted", [token])
        drafted.fill_bitmask(bitmask, len(valid))
        drafted.rollback(len(valid))
        kept = 0
        while kept < len(valid) and i + kept < steps and valid[kept] == tokens[i + kept]:
            assert torch.equal(bitmask[kept], masks[i + kept]), f"mask at {i + kept}"
            kept += 1
        if i + kept < steps:
            assert torch.equal(bitmask[kept], masks[i + kept]), f"bonus mask at {i + kept}"
        commit = tokens[i : min(i + kept + 1, steps)]
        assert drafted.accept_tokens("drafted", commit)
        i += len(commit)
    drafted.fill_bitmask(bitmask, 0)
    assert torch.equal(bitmask[0], masks[steps])
    assert cut > 0


@pytest.mark.parametrize(("choice", "max_tokens"), [("required", 24), ("required", 60), ("auto", 60)])
def test_validated_drafts_are_the_prefix_the_row_itself_takes(
    tokenizer: Any, choice: str, max_tokens: int
) -> None:
    """``validate_tokens`` (on the matcher alone where the row's engine runs everywhere) against
    the row itself: at every position of a plain run, random drafts (the run's next tokens, one
    replaced by a random or a stop token) are cut exactly where a copy of the row, fed the drafts
    one by one with a fill before each, refuses one or terminates; and validating leaves the row
    where it was (the next mask is the plain run's)."""
    grammar, width, steps, tokens, masks = plain_run(tokenizer, choice, max_tokens)
    rng = random.Random(1)
    bitmask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
    row = grammar()
    stop = tokenizer.eos_token_id
    cut = 0
    for i in range(steps):
        for _ in range(3 if i else 0):  # vLLM drafts from the second step on
            drafts = tokens[i : i + 3]
            if drafts and rng.random() < 0.7:
                drafts[rng.randrange(len(drafts))] = stop if rng.random() < 0.3 else rng.randrange(width)
            copy = grammar()
            for j, token in enumerate(tokens[:i]):
                copy.fill_bitmask(bitmask, 0)
                assert copy.accept_tokens("copy", [token]), j
            taken = 0
            for token in drafts:
                if copy.is_terminated():
                    break
                copy.fill_bitmask(bitmask, 0)
                if not copy.accept_tokens("copy", [token]):
                    break
                taken += 1
            assert row.validate_tokens(list(drafts)) == drafts[:taken], (i, drafts)
            cut += taken < len(drafts)
        row.fill_bitmask(bitmask, 0)
        assert torch.equal(bitmask[0], masks[i]), f"mask at {i}"
        assert row.accept_tokens("row", [tokens[i]])
    assert cut > 0


def test_a_bitmask_of_another_width_is_refused_not_filled_elsewhere(tokenizer: Any) -> None:
    """The core fills vLLM's bitmask in place; one of another width would make it fill a bitmask
    of its own (vLLM's row left as it was), so it is refused."""
    from vllm import SamplingParams

    from hermes_vllm.processor.hosted import RowHost

    width = len(tokenizer)
    host = RowHost(ConstraintCore(lambda: tokenizer, width, engine="auto"), window=4)
    row = host.grammar(SamplingParams(max_tokens=40, extra_args=constraint_args([TOOL], "required")))
    with pytest.raises(ValueError, match="not the hermes-vllm core's"):
        row.fill_bitmask(torch.zeros((2, (width + 31) // 32 + 1), dtype=torch.int32), 1)


def test_a_hosted_rows_matcher_is_built_on_the_compile_thread(tokenizer: Any) -> None:
    """vLLM builds a request's grammar on its compile thread (``RowHost.grammar``); an engine-only
    row's matcher is built there too, not by its first fill on the scheduler's thread."""
    from vllm import SamplingParams

    from hermes_vllm.processor.hosted import RowHost

    host = RowHost(ConstraintCore(lambda: tokenizer, len(tokenizer), engine="auto"), window=4)
    row = host.grammar(SamplingParams(max_tokens=40, extra_args=constraint_args([TOOL], "required")))
    assert row.state.engine.matcher is not None


def test_a_long_call_is_marked_only_where_its_row_is_read_whole(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a call, a token that only lengthens it (here a long string, ASCII and not) is taken
    on the hosted row's light path: no mark, no settling, however long the call; the row is marked
    only at tokens read whole (the tags, the stop). Through vLLM's draft protocol, wrong drafts
    included, every kept position's mask is still the core's own (the batch processors' path:
    :meth:`ConstraintCore.advance` and :meth:`ConstraintCore.fill`, token by token)."""
    from vllm import SamplingParams

    from hermes_vllm.processor.hosted import RowHost
    from hermes_vllm.processor.row import RowState

    width = len(tokenizer)
    core = ConstraintCore(lambda: tokenizer, width, engine="auto")
    host = RowHost(core, window=4)
    params = SamplingParams(max_tokens=400, extra_args=constraint_args([TOOL], "required"))
    city = "Saint-Rémy " * 30
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'
    tokens = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    reference = core.admit_params(params)
    assert reference is not None
    masks = []
    for token in tokens:
        bitmask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
        masked, _ = core.fill([(0, reference)], width, bitmask=bitmask)
        if not masked:
            bitmask[0].fill_(-1)
        masks.append(bitmask[0].clone())
        core.advance(reference, [token])
    assert reference.failed is None and reference.engine.ended

    row = host.grammar(params)
    marks = 0
    mark = RowState.mark

    def counted(state: RowState, behind: int = 0) -> Any:
        nonlocal marks
        marks += 1
        return mark(state, behind)

    monkeypatch.setattr(RowState, "mark", counted)
    play_drafts(row, tokens, masks, width, random.Random(2), 0.3)
    assert row.is_terminated()
    assert len(tokens) > 150 and marks <= 12, marks


def _release_manager(tiny_model: Path, width: int) -> Any:
    """The running release's ``StructuredOutputManager`` for a config with ngram drafts (its
    bitmask given directly: its backend is built by a grammar of vLLM's own, which none is)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.structured_output import StructuredOutputManager

    from hermes_vllm.testing.engine import triton_assumed

    args = EngineArgs(model=str(tiny_model), dtype="float32", max_model_len=512, speculative_config=NGRAM)
    with triton_assumed():
        manager = StructuredOutputManager(args.create_engine_config())
    rows = manager.vllm_config.scheduler_config.max_num_seqs * (1 + NGRAM["num_speculative_tokens"])
    manager._grammar_bitmask = torch.zeros((rows, (width + 31) // 32), dtype=torch.int32)
    return manager


@pytest.mark.parametrize(("choice", "max_tokens"), [("auto", 60), ("required", 24)])
def test_the_releases_own_draft_protocol_keeps_only_masked_tokens(
    tokenizer: Any, tiny_model: Path, choice: str, max_tokens: int
) -> None:
    """vLLM's own scheduler code on our hosted row, whichever release runs (0.32 in the venv, 0.33
    and 0.34 under ``make compat``): drafts trimmed (``validate_tokens``; 0.34's
    ``trim_spec_tokens`` keeps the first grammar-invalid draft too), the bitmask filled by
    ``grammar_bitmask`` (0.34 feeds each draft to ``accept_tokens``, a refused one included, fills
    the rows after it unmasked and rolls back only what was accepted), verification played as
    rejection sampling does it, then the kept tokens accepted. Every row a kept or bonus token
    comes from is the plain run's mask at that position: no unmasked row ever reaches a call, and
    a refused draft leaves the row where it was."""
    grammar, width, steps, tokens, masks = plain_run(tokenizer, choice, max_tokens)
    manager = _release_manager(tiny_model, width)
    trim = getattr(manager, "trim_spec_tokens", None) or manager.validate_tokens
    row = grammar()
    request = SimpleNamespace(
        structured_output_request=SimpleNamespace(grammar=row, reasoning_ended=True),
        use_structured_output=True,
        request_id="r",
    )
    rng = random.Random(2)
    i = refused = 0
    while i < steps:
        drafts = tokens[i : i + rng.randint(0, NGRAM["num_speculative_tokens"])]
        if drafts and rng.random() < 0.6:
            drafts[rng.randrange(len(drafts))] = rng.randrange(width)
        scheduled = trim(request, list(drafts))
        bitmask = torch.from_numpy(manager.grammar_bitmask({"r": request}, ["r"], {"r": scheduled}))
        kept = 0
        # Rejection sampling with a greedy target: a draft stays while it is the plain run's token
        # and its row allows it; the first position that does not keep its draft takes the
        # target's token from its own row (the bonus row after the last draft).
        while kept < len(scheduled) and i + kept < steps:
            assert torch.equal(bitmask[kept], masks[i + kept]), f"row {kept} at {i}"
            if scheduled[kept] != tokens[i + kept] or not token_allowed(
                bitmask[kept].numpy(), scheduled[kept]
            ):
                refused += scheduled[kept] != tokens[i + kept]
                break
            kept += 1
        if i + kept < steps:
            assert torch.equal(bitmask[kept], masks[i + kept]), f"bonus row {kept} at {i}"
        commit = tokens[i : min(i + kept + 1, steps)]
        assert row.accept_tokens("r", commit)
        i += len(commit)
    row.fill_bitmask(manager._grammar_bitmask, 0)
    assert torch.equal(manager._grammar_bitmask[0], masks[steps])
    assert refused > 0


def test_a_refused_token_leaves_the_hosted_row_as_it_was(tokenizer: Any) -> None:
    """``accept_tokens`` with a refused token after accepted ones: False, and the row (its mask,
    its rollback trail) is where it was before the call (vLLM 0.34's contract)."""
    grammar, width, _steps, tokens, masks = plain_run(tokenizer, "required", 60)
    row = grammar()
    bitmask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
    assert row.accept_tokens("r", tokens[:5])
    wrong = next(t for t in range(width) if not row.validate_tokens([*tokens[5:8], t])[3:])
    assert not row.accept_tokens("r", [*tokens[5:8], wrong])
    row.fill_bitmask(bitmask, 0)
    assert torch.equal(bitmask[0], masks[5])
    row.rollback(2)
    row.fill_bitmask(bitmask, 0)
    assert torch.equal(bitmask[0], masks[3])


def play_drafts(
    row: Any, tokens: list[int], masks: list[torch.Tensor], width: int, rng: random.Random, wrong: float
) -> None:
    """vLLM's draft protocol over ``row`` for the run ``tokens`` (``masks``: the mask before each):
    random drafts (the run's next tokens, one replaced by a random token of the ``width`` at the
    rate ``wrong``) validated, each filled and accepted, the bonus row filled, rolled back, then
    the kept drafts and the target's own token after them accepted; every row a kept or bonus
    token comes from is the run's mask at that position."""
    bitmask = torch.zeros((5, masks[0].numel()), dtype=torch.int32)
    i = 0
    while i < len(tokens):
        drafts = tokens[i : i + rng.randint(0, 3)]
        if drafts and rng.random() < wrong:
            drafts[rng.randrange(len(drafts))] = rng.randrange(width)  # a wrong draft
        valid = row.validate_tokens(list(drafts))
        for j, token in enumerate(valid):
            row.fill_bitmask(bitmask, j)
            assert row.accept_tokens("r", [token])
        if not row.is_terminated():
            row.fill_bitmask(bitmask, len(valid))
        row.rollback(len(valid))
        kept = 0  # the drafts the target keeps, then its own token after them
        while kept < len(valid) and i + kept < len(tokens) - 1 and valid[kept] == tokens[i + kept]:
            kept += 1
        for k in range(kept + 1):
            assert torch.equal(bitmask[k], masks[i + k]), f"mask at {i + k} of {tokens}"
        assert row.accept_tokens("r", tokens[i : i + kept + 1])
        i += kept + 1


def core_walk(
    core: ConstraintCore, tokenizer: Any, args: dict[str, Any], max_tokens: int, rng: random.Random
) -> tuple[list[int], list[torch.Tensor]]:
    """A row the core follows token by token (the batch processors' path, no drafts), each token
    drawn from what its mask allows, tags, brackets and split characters weighed up: its tokens
    and the mask before each."""
    import numpy as np

    width = len(tokenizer)
    latin1 = core.compiler.vocab.latin1
    weighed = np.array([("<" in p or "}" in p or '"' in p or not p.isascii()) for p in latin1])
    state = core.admit(args, [tokenizer.eos_token_id], max_tokens=max_tokens)
    assert state is not None
    tokens: list[int] = []
    masks: list[torch.Tensor] = []
    bitmask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
    while len(tokens) < max_tokens and not state.engine.ended:
        masked, _ = core.fill([(0, state)], width, bitmask=bitmask)
        if not masked:
            bitmask[0].fill_(-1)
        masks.append(bitmask[0].clone())
        bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[:width].astype(bool)
        allowed = np.flatnonzero(bits)
        favoured = np.flatnonzero(bits & weighed[:width])
        token = int(rng.choice(favoured if favoured.size and rng.random() < 0.6 else allowed))
        core.advance(state, (token,))
        tokens.append(token)
    assert state.failed is None
    return tokens, masks


RICH = tool(
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "near": {"type": "array", "items": {"type": "string"}},
            "at": {
                "anyOf": [{"type": "string"}, {"type": "object", "properties": {"c": {"type": "string"}}}]
            },
            "n": {"type": ["integer", "null"]},
        },
        "required": ["city"],
    },
    "get_weather",
)
"""A tool whose strings all repeat their masks (``strings_repeat``): strings at several depths,
in an array, in a union with an object holding one."""


@pytest.mark.parametrize(
    ("choice", "max_tokens", "tool"),
    [
        ("required", 160, TOOL),
        ("named", 120, TOOL),
        ("auto", 120, TOOL),
        ("auto", 160, RICH),
        ("required", 120, RICH),
    ],
)
def test_random_turns_with_random_drafts_are_masked_as_the_core_masks_them(
    tokenizer: Any, choice: str, max_tokens: int, tool: dict[str, Any]
) -> None:
    """Random turns (spans, calls, tags, free text, the stop: whatever the masks allow) that the
    core followed token by token, replayed through hosted rows under vLLM's draft protocol with
    random drafts (the turn's next tokens, some replaced): at every kept position the hosted row's
    mask is the core's, where the row takes its tokens on its engine alone (tags and stop
    included, up to the budget's calm bound) as well as past that bound, rollbacks across it
    included."""
    from vllm import SamplingParams

    from hermes_vllm.processor.hosted import RowHost

    width = len(tokenizer)
    core = ConstraintCore(lambda: tokenizer, width, engine="xgrammar")
    host = RowHost(core, window=4)
    args = constraint_args([tool], NAMED if choice == "named" else choice)
    rng = random.Random(max_tokens)
    for _ in range(3):
        tokens, masks = core_walk(core, tokenizer, args, max_tokens, rng)
        row = host.grammar(SamplingParams(max_tokens=max_tokens, extra_args=args))
        play_drafts(row, tokens, masks, width, rng, 0.4)


LONG_CITY = (
    "Saint-Remy-de-Provence near the Alpilles hills and the Roman ruins of Glanum where Van Gogh painted"
)


def scripted_turn(
    core: ConstraintCore, tokenizer: Any, args: dict[str, Any], text: str, max_tokens: int
) -> tuple[list[int], list[torch.Tensor]]:
    """``text`` then the stop token, followed by the core token by token (no drafts): its tokens
    and the core's mask before each."""
    width = len(tokenizer)
    tokens = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    state = core.admit(args, [tokenizer.eos_token_id], max_tokens=max_tokens)
    assert state is not None
    masks: list[torch.Tensor] = []
    bitmask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
    for token in tokens:
        if not core.fill([(0, state)], width, bitmask=bitmask)[0]:
            bitmask[0].fill_(-1)
        assert token_allowed(bitmask[0].numpy(), token), (token, text)
        masks.append(bitmask[0].clone())
        core.advance(state, (token,))
    assert state.failed is None
    return tokens, masks


def _native_fills(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the fills hosted rows ask of xgrammar's matchers."""
    from hermes_vllm.grammar.engines import xgrammar

    count = [0]
    direct, fill_rows = xgrammar.XGrammarMatcher.direct, xgrammar.XGrammarMatcher.fill_rows

    def counted(self: Any) -> Any:
        accept, fill, rollback = direct(self)

        def fill_counted(bitmask: torch.Tensor, row: int, debug: bool) -> Any:
            count[0] += 1
            return fill(bitmask, row, debug)

        return accept, fill_counted, rollback

    def rows_counted(self: Any, bitmask: torch.Tensor) -> Any:
        fill = fill_rows(self, bitmask)

        def fill_counted(row: int, debug: bool) -> Any:
            count[0] += 1
            return fill(row, debug)

        return fill_counted

    monkeypatch.setattr(xgrammar.XGrammarMatcher, "direct", counted)
    monkeypatch.setattr(xgrammar.XGrammarMatcher, "fill_rows", rows_counted)
    return count


@pytest.mark.parametrize(("choice", "max_tokens"), [("auto", 400), ("required", 100)])
def test_a_string_values_plain_tokens_repeat_its_mask_instead_of_asking_the_engine(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch, choice: str, max_tokens: int
) -> None:
    """Inside a call, on a row whose text is followed there (a gated ``auto`` row; a ``required``
    row past its budget's calm bound), a fill inside an unbounded string value that allows every
    plain token is the mask after each further plain token: the row copies it instead of asking
    xgrammar, and every kept mask is still the core's (random drafts, some wrong, rollbacks over
    the string)."""
    from vllm import SamplingParams

    from hermes_vllm.processor.hosted import RowHost

    width = len(tokenizer)
    core = ConstraintCore(lambda: tokenizer, width, engine="xgrammar")
    args = constraint_args([TOOL], choice)
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{LONG_CITY}"}}}}\n</tool_call>'
    tokens, masks = scripted_turn(
        core, tokenizer, args, ("Sure. " if choice == "auto" else "") + text, max_tokens
    )
    native = _native_fills(monkeypatch)
    city = len(tokenizer.encode(LONG_CITY, add_special_tokens=False))
    for wrong in (0.0, 0.4):
        fills = []
        for repeat in (False, True):
            with monkeypatch.context() as patch:
                if not repeat:
                    patch.setattr(ConstraintCore, "string_plain", lambda self, end: None)
                native[0] = 0
                row = RowHost(core, window=4).grammar(SamplingParams(max_tokens=max_tokens, extra_args=args))
                play_drafts(row, tokens, masks, width, random.Random(7), wrong)
                fills.append(native[0])
        assert fills[1] <= fills[0] - city // 3, (fills, city)


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_row_bound_to_one_bitmask_fills_another_where_it_is_given_one(tokenizer: Any, choice: str) -> None:
    """A hosted row binds its light path's fill to vLLM's bitmask (``EngineMatcher.fill_rows``:
    xgrammar's FFI view of it) and copies repeated string masks into it; given another bitmask,
    it fills that one, copies included, every row the core's mask."""
    from vllm import SamplingParams

    from hermes_vllm.processor.hosted import RowHost

    width = len(tokenizer)
    core = ConstraintCore(lambda: tokenizer, width, engine="xgrammar")
    args = constraint_args([TOOL], choice)
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{LONG_CITY}"}}}}\n</tool_call>'
    tokens, masks = scripted_turn(core, tokenizer, args, text, 400)
    row = RowHost(core, window=4).grammar(SamplingParams(max_tokens=400, extra_args=args))
    bitmasks = [torch.zeros((3, masks[0].numel()), dtype=torch.int32) for _ in range(2)]
    rng = random.Random(3)
    for i, token in enumerate(tokens):
        bitmask = bitmasks[rng.randrange(2)]
        bitmask.fill_(0x5A5A5A5A)
        row.fill_bitmask(bitmask, 1)
        assert torch.equal(bitmask[1], masks[i]), f"mask at {i}"
        assert row.accept_tokens("r", [token])
    assert row.is_terminated()


def test_a_bounded_string_is_filled_by_the_engine_at_every_position(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``maxLength`` a string's mask allows every plain token until its last characters,
    then narrows: such a turn's masks do not repeat (``strings_repeat``), and its rows keep the
    core's masks to the string's end. Were they taken to repeat, they would not."""
    from vllm import SamplingParams

    from hermes_vllm.grammar.engines import xgrammar
    from hermes_vllm.processor.hosted import RowHost

    width = len(tokenizer)
    text = (
        f'Sure. <tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{LONG_CITY}"}}}}\n</tool_call>'
    )
    for forced in (False, True):
        if forced:  # the guard left out: the row repeats a mask the string's bound has narrowed
            monkeypatch.setattr(xgrammar, "strings_repeat", lambda turn: True)
        # A bound of its own each time: compiled grammars are shared by the process.
        city = {"type": "string", "maxLength": len(LONG_CITY) + 2 + forced}
        parameters = {"type": "object", "properties": {"city": city}, "required": ["city"]}
        bounded = {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}
        args = constraint_args([bounded], "auto")
        core = ConstraintCore(lambda: tokenizer, width, engine="xgrammar")
        tokens, masks = scripted_turn(core, tokenizer, args, text, 400)
        row = RowHost(core, window=4).grammar(SamplingParams(max_tokens=400, extra_args=args))
        if not forced:
            play_drafts(row, tokens, masks, width, random.Random(3), 0.0)
            continue
        with pytest.raises(AssertionError, match="mask at"):
            play_drafts(row, tokens, masks, width, random.Random(3), 0.0)
