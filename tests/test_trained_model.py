"""The trained model's recipe: a fixed split, data that renders through Qwen 3's real template
and reads back through our parser, and byte-identical weights for the same recipe."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hermes_vllm.demo import trained_model as tm
from hermes_vllm.dialect import get_dialect
from hermes_vllm.parsers.span_stream import SpanStream
from hermes_vllm.testing.tiny_model import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tokenizer("qwen3", tmp_path_factory.mktemp("qwen3"))


def test_the_split_is_fixed_by_id_and_disjoint() -> None:
    held, trained = tm.held_out_items(), tm.training_items()
    held_ids, trained_ids = {i.id for i in held}, {i.id for i in trained}
    assert not held_ids & trained_ids
    assert held_ids | trained_ids == {i.id for i in tm.bfcl_items()}
    assert (len(held), len(trained)) == (436, 1853)  # the pinned wheel's renderable items
    assert held[0].id == "live_multiple_13-4-5" and all(tm.is_held_out(i) for i in held_ids)
    assert {i.category for i in held} >= {"simple_python", "multiple", "parallel", "live_multiple"}


def test_targets_take_the_first_possible_value_and_leave_out_optional_ones() -> None:
    item = next(i for i in tm.bfcl_items() if i.id == "simple_python_0")
    assert item.target == [tm.Call("calculate_triangle_area", {"base": 10, "height": 5, "unit": "units"})]
    weather = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    assert tm.target_calls(weather, [{"w": {"city": ["Paris"], "unit": ["", "celsius"]}}]) == [
        tm.Call("w", {"city": "Paris"})
    ]
    assert tm.target_calls(weather, [{"other": {}}]) is None


def _sample() -> list[tm.Item]:
    """A few items of every category, some with reasoning, parallel calls among them."""
    by_category: dict[str, list[tm.Item]] = {}
    for item in tm.training_items():
        by_category.setdefault(item.category, []).append(item)
    return [item for items in by_category.values() for item in items[:4]]


def test_examples_render_through_qwen3s_template_and_read_back_through_our_parser(tokenizer: Any) -> None:
    sample = _sample()
    assert any(len(i.target) > 1 for i in sample) and any(tm.reasoning_for(i) for i in sample)
    for item in sample:
        reasoning = tm.reasoning_for(item)
        prompt, reply = tm.render(tokenizer, tm.Turn(item))
        system = prompt.split("<|im_end|>")[0]  # the item's own system message, then the tools
        assert system.startswith("<|im_start|>system\n") and "\n# Tools\n" in "\n" + system
        assert prompt.endswith("<|im_start|>assistant\n")
        assert json.dumps(item.tools[0]["function"]["name"]) in prompt  # the tools sit in the system turn
        assert reply.endswith("</tool_call><|im_end|>")
        read = SpanStream(get_dialect("qwen")).read(reply.removesuffix("<|im_end|>"))
        assert [(c.name, json.loads(c.arguments)) for c in read.calls] == [
            (c.name, c.arguments) for c in item.target
        ], item.id
        assert read.reasoning.strip() == (reasoning or ""), item.id
        assert not read.content.strip(), item.id


def test_one_training_item_in_four_renders_in_the_bracket_dialect_and_reads_back(tokenizer: Any) -> None:
    items = tm.training_items()
    brackets = [i for i in items if tm.dialect_of(i) == tm.BRACKETS]
    assert 0.2 < len(brackets) / len(items) < 0.3
    assert all(tm.dialect_of(i) is None for i in items if i not in brackets)
    for item in brackets[:20]:
        prompt, reply = tm.render(tokenizer, tm.Turn(item), tm.dialect_of(item))
        assert "[tool_call]" in prompt and "<tool_call>" not in prompt  # the system turn names its tags
        assert prompt.endswith("<|im_start|>assistant\n") and reply.endswith("[/tool_call]<|im_end|>")
        read = SpanStream(get_dialect(tm.BRACKETS)).read(reply.removesuffix("<|im_end|>"))
        assert [(c.name, json.loads(c.arguments)) for c in read.calls] == [
            (c.name, c.arguments) for c in item.target
        ], item.id
        assert not read.content.strip() and not read.reasoning, item.id


def test_the_turn_after_the_tool_results_answers_from_them_or_makes_the_calls_left(tokenizer: Any) -> None:
    """Follow-up turns: the calls made and their results in the prompt, then an answer built from
    the results (a sentence or a JSON object), or the calls the question still needs."""
    items = tm.training_items()
    turns = tm.training_turns(items)
    followed = [t for t in turns if t.done]
    assert 0.4 < len({t.item.id for t in followed}) / len(items) < 0.6
    answers = [t for t in followed if not t.next_calls]
    more = [t for t in followed if t.next_calls]
    assert more and all(t.done == 1 < len(t.item.target) for t in more)
    shapes = {"json": 0, "text": 0}
    for turn in answers[:30] + more[:10]:
        dialect = tm.dialect_of(turn.item)
        prompt, reply = tm.render(tokenizer, turn, dialect)
        response = get_dialect(dialect or "qwen").tool_response.begin
        assert prompt.count(response) == turn.done, turn.item.id  # one result per call made
        for call in turn.made:
            assert tm.tool_result(call) in prompt, turn.item.id
        read = SpanStream(get_dialect(dialect or "qwen")).read(reply.removesuffix("<|im_end|>"))
        assert [(c.name, json.loads(c.arguments)) for c in read.calls] == [
            (c.name, c.arguments) for c in turn.next_calls
        ], turn.item.id
        if not turn.next_calls:
            answer = read.content.strip()
            values = [str(tm.result_value(c)) for c in turn.made]
            assert all(v in answer for v in values), (turn.item.id, answer)
            shapes["json" if answer.startswith("{") else "text"] += 1
    assert shapes["json"] and shapes["text"], shapes


def test_the_same_recipe_gives_byte_identical_weights(tmp_path: Path) -> None:
    recipe = replace(
        tm.DEFAULT_RECIPE, steps=3, hidden_size=32, num_layers=1, intermediate_size=32, batch_size=2
    )
    items = [i for i in tm.training_items() if i.category == "simple_python"][:6]
    tm.train(recipe, tmp_path / "a", items)
    tm.train(recipe, tmp_path / "b", items)
    tm.train(replace(recipe, seed=1), tmp_path / "c", items)
    weights = [(tmp_path / d / "model.safetensors").read_bytes() for d in "abc"]
    assert weights[0] == weights[1]
    assert weights[0] != weights[2]
    assert recipe.digest() != replace(recipe, steps=4).digest()


def test_training_runs_apart_on_the_recipes_kernels(tmp_path: Path) -> None:
    """Kernels reduce in another order on a machine with more instructions (AVX-512), so the
    cached model is trained in a process of its own whose kernels are pinned to the recipe's."""
    recipe = replace(
        tm.DEFAULT_RECIPE, steps=2, hidden_size=32, num_layers=1, intermediate_size=32, batch_size=2
    )
    tm.train_apart(recipe, tmp_path)
    marker = json.loads((tmp_path / tm.MARKER).read_text(encoding="utf-8"))
    assert marker["kernels"] == recipe.kernels.upper() and marker["digest"] == recipe.digest()
    assert recipe.digest() != replace(recipe, kernels="avx512").digest()
