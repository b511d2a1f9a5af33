"""A small tool-calling model trained here, deterministically: a model that tries.

Random-weight models prove the constraint (garbage in, valid calls out) but not what a serving
team asks first: on a model that actually tries to call tools, how many replies does a parser
lose, and does a constraint ever pick a worse tool? No pretrained weights can be downloaded
here, so this module trains one on the CPU from the pinned ``bfcl-eval`` wheel:

- **Data**: every single-turn BFCL v4 item with ground truth (simple, multiple, parallel, live),
  tools converted to JSON Schema (:func:`hermes_vllm.schema.bfcl_to_json_schema`), the target
  calls built from the possible answers (the first acceptable value of each argument; items
  whose target does not validate against its tool's schema are skipped). A fixed hash of the
  item id puts one item in five into the held-out split (:func:`held_out_items`), never trained
  on; the same for every machine and every recipe.
- **Turns after tool results**: for one item in :data:`FOLLOW_UP_EVERY` (by a hash of its id),
  the conversation goes on (:class:`Turn`): the target calls made, one ``tool`` message per call
  with a made-up result (BFCL holds none: :func:`tool_result`), then the answer built from the
  results, a sentence or a JSON object (:func:`answer_text`); for an item of several calls, also
  the turn after the first call's result, where the rest of the calls are due. So under ``auto``
  the model stops calling once the question is answered and calls again while it is not, which is
  what an agent loop needs (BFCL's multi-turn data is stateful API sessions in another shape, not
  used).
- **Format**: the conversation rendered through Qwen 3's own chat template (tools in the system
  turn, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` replies, some with a
  ``<think>`` block naming the tool before the call), on Qwen 3's real tokenizer; one training
  item in :data:`BRACKETS_EVERY` (by a hash of its id) through our ``chatml-brackets`` template
  instead (its system turn names ``[tool_call]``), so one model serves both dialects, each with
  its own template (:func:`dialect_of`).
- **Model and training**: :mod:`hermes_vllm.demo.trained_model` ``Recipe`` (a Qwen 3
  architecture, a fixed seed and step count, never a time limit, the x86 kernels pinned to one
  instruction set, so the same recipe gives byte-identical weights), cached in the artifact cache
  under the recipe's hash.

Usage: ``python -m hermes_vllm.demo.trained_model [--steps N] [OUT]``
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from hermes_vllm.demo.bfcl import BFCL_FILES, as_openai_tool, json_lines, registry_bfcl
from hermes_vllm.formats.chat_template import chat_template
from hermes_vllm.testing.artifacts import unpacked
from hermes_vllm.testing.registry_tokenizers import LOGITS_WIDTH
from hermes_vllm.testing.tiny_model import BUILD_VERSION, load_tokenizer, pin_silent_channel, silence_rows

logger = logging.getLogger(__name__)

DATA_VERSION = 3
"""Bump when the examples built from the corpus change, so cached models are retrained."""
SIMPLE_ARGUMENTS = 2
"""The most arguments a call of the curriculum's first stage has."""
HELD_OUT_EVERY = 5
"""One item in this many is held out (by a hash of its id, not by its position in a file)."""
BRACKETS_EVERY = 4
"""One training item in this many is rendered in the bracket dialect (by a hash of its id)."""
BRACKETS = "chatml-brackets"
FOLLOW_UP_EVERY = 2
"""One training item in this many (by a hash of its id) also teaches the turn after its tool results."""
JSON_ANSWER_EVERY = 2
"""One answer in this many (by a hash of its id) is a JSON object rather than a sentence."""


@dataclass(frozen=True)
class Call:
    """One target call: a tool name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Item:
    """One BFCL question with what it takes to ask it and to judge a reply.

    ``tools`` are OpenAI function tools (parameters in standard JSON Schema), ``messages`` the
    question's first (and only) turn as chat messages, ``possible_answers`` BFCL's ground truth
    (``[{name: {argument: [acceptable values]}}]``, ``""`` meaning the argument may be left out),
    ``target`` the calls training writes for it.
    """

    id: str
    category: str
    """The BFCL file it comes from, less ``BFCL_v4_`` and ``.json`` (``simple_python``, ``live_multiple``)."""
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    possible_answers: list[dict[str, dict[str, list[Any]]]]
    target: list[Call]

    @property
    def expected_names(self) -> list[str]:
        """The tool names of the expected calls, in order (the "right tool" of a reply)."""
        return [call.name for call in self.target]

    @property
    def schemas(self) -> dict[str, dict[str, Any]]:
        """Tool name -> its parameters' JSON Schema."""
        return {t["function"]["name"]: t["function"]["parameters"] for t in self.tools}


def is_held_out(item_id: str) -> bool:
    """Whether the item with this id is in the held-out split: fixed by the id alone."""
    return int(hashlib.sha256(item_id.encode("utf-8")).hexdigest()[:8], 16) % HELD_OUT_EVERY == 0


def _first_value(values: list[Any]) -> tuple[bool, Any]:
    """(present, value): BFCL's ``""`` first means the argument is best left out."""
    return (False, None) if values[0] == "" else (True, values[0])


def target_calls(
    item_tools: list[dict[str, Any]], ground_truth: list[dict[str, dict[str, list[Any]]]]
) -> list[Call] | None:
    """The calls the possible answers describe, each argument its first acceptable value;
    ``None`` when one names no offered tool or does not validate against the tool's schema."""
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in item_tools}
    calls = []
    for answer in ground_truth:
        ((name, possible),) = answer.items()
        if name not in schemas or not all(isinstance(v, list) and v for v in possible.values()):
            return None
        arguments = {}
        for key, values in possible.items():
            present, value = _first_value(values)
            if present:
                arguments[key] = value
        try:
            jsonschema.validate(arguments, schemas[name])
        except (jsonschema.ValidationError, jsonschema.SchemaError):
            return None
        calls.append(Call(name, arguments))
    return calls


@cache
def bfcl_items() -> tuple[Item, ...]:
    """Every renderable single-turn BFCL item of the pinned wheel, files in name order."""
    folder = registry_bfcl()
    items = []
    for name in BFCL_FILES:
        answers = {a["id"]: a["ground_truth"] for a in json_lines(folder / "possible_answer" / name)}
        for question in json_lines(folder / name):
            truth = answers.get(question["id"])
            if truth is None or len(question["question"]) != 1:
                continue
            tools = [as_openai_tool(f) for f in question["function"]]
            target = target_calls(tools, truth)
            if target is None:
                continue
            category = name.removeprefix("BFCL_v4_").removesuffix(".json")
            items.append(Item(question["id"], category, tools, question["question"][0], truth, target))
    return tuple(items)


def held_out_items() -> list[Item]:
    """The held-out split (about one item in :data:`HELD_OUT_EVERY`): never trained on."""
    return [item for item in bfcl_items() if is_held_out(item.id)]


def training_items() -> list[Item]:
    """The items the model is trained on: every renderable item not held out."""
    return [item for item in bfcl_items() if not is_held_out(item.id)]


@dataclass(frozen=True)
class Example:
    """One training sequence: the prompt's token ids and the reply's, which alone carry the loss."""

    item_id: str
    prompt: list[int]
    reply: list[int]
    simple: bool
    """One tool offered, one call with few arguments: the curriculum's first stage."""


def dialect_of(item: Item) -> str | None:
    """The dialect whose template renders ``item`` in training: :data:`BRACKETS` for one item in
    :data:`BRACKETS_EVERY`, else None (Qwen 3's own template, ``<tool_call>``)."""
    return None if _hashed("brackets", item) % BRACKETS_EVERY else BRACKETS


def _hashed(salt: str, item: Item) -> int:
    return int(hashlib.sha256(f"{salt}:{item.id}".encode()).hexdigest()[:8], 16)


def reasoning_for(item: Item) -> str | None:
    """The ``<think>`` text some training replies carry (fixed by the item id: one in three),
    naming the tool(s) before the call, so reasoning first and then a call is a pattern seen."""
    if _hashed("think", item) % 3:
        return None
    names = list(dict.fromkeys(item.expected_names))
    plural = "calls" if len(item.target) > 1 else "call"
    return f"The user asks for {', '.join(names)}. I will make {len(item.target)} {plural}."


def assistant_message(calls: list[Call], reasoning: str | None = None) -> dict[str, Any]:
    """The assistant turn that makes ``calls``, as Qwen 3's chat template reads one."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ],
    }
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def _digest(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16)


def result_key(name: str) -> str:
    """What a result of tool ``name`` is called: the name's last word (``calculate_triangle_area``
    -> ``area``, ``math.hcf`` -> ``hcf``)."""
    words = re.findall(r"[A-Za-z]+", name)
    return words[-1].lower() if words else "result"


def result_value(call: Call) -> int | float:
    """The number ``call`` returns, made up from a hash of the call (BFCL holds no results)."""
    digest = _digest(json.dumps([call.name, call.arguments], sort_keys=True, default=str))
    return digest % 1000 if digest % 2 else round(digest % 100_000 / 100, 2)


def tool_result(call: Call) -> str:
    """The ``tool`` message's content for ``call``: its number, bare (as an agent client sends a
    function's ``float``), or, for one call in three, in an object under :func:`result_key`."""
    value = result_value(call)
    if _digest(f"object:{call.name}:{value}") % 3 == 0:
        return json.dumps({result_key(call.name): value})
    return json.dumps(value)


@dataclass(frozen=True)
class Turn:
    """A point in an item's conversation where the model writes next: its first turn (``done``
    0), or the turn after the results of its first ``done`` target calls. After all of them the
    model answers from the results; after some of them it makes the rest. That is what an agent
    loop asks: stop calling once the question is answered, call again while it is not."""

    item: Item
    done: int = 0

    @property
    def made(self) -> list[Call]:
        """The calls already made and answered."""
        return self.item.target[: self.done]

    @property
    def next_calls(self) -> list[Call]:
        """The calls the model makes now; none: it answers."""
        return self.item.target[self.done :]

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The conversation so far as a client sends it: the question, then (after the first
        turn) the assistant's calls (their arguments a JSON string, as the API wants; the
        templates render it as they render an object) and one ``tool`` message with each call's
        result."""
        if not self.done:
            return self.item.messages
        ids = [f"call_{k}" for k in range(self.done)]
        calls = [
            {
                "id": id_,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
            }
            for id_, c in zip(ids, self.made, strict=True)
        ]
        made = {"role": "assistant", "content": "", "tool_calls": calls}
        results = [
            {"role": "tool", "tool_call_id": id_, "content": tool_result(c)}
            for id_, c in zip(ids, self.made, strict=True)
        ]
        return [*self.item.messages, made, *results]

    def reply(self) -> dict[str, Any]:
        """The assistant message the model is trained to write here."""
        if self.next_calls:
            return assistant_message(self.next_calls, None if self.done else reasoning_for(self.item))
        return {"role": "assistant", "content": answer_text(self)}


def answer_text(turn: Turn) -> str:
    """The answer after every result came back, built from the results: a sentence, or for one
    item in :data:`JSON_ANSWER_EVERY` a JSON object (the shape a ``response_format`` schema
    holds the answer to; the model never sees that schema, so it learns both)."""
    pairs = [(result_key(c.name), result_value(c)) for c in turn.made]
    if _hashed("json", turn.item) % JSON_ANSWER_EVERY == 0:
        return json.dumps(dict(pairs) if len(pairs) == 1 else {"results": [v for _, v in pairs]})
    return " ".join(f"The {key} is {value}." for key, value in pairs)


def follow_ups(item: Item) -> list[Turn]:
    """The turns after ``item``'s tool results: the answer after all of them and, for an item
    of several calls, the rest of the calls after the first one's result."""
    count = len(item.target)
    return [Turn(item, count), *([Turn(item, 1)] if count > 1 else [])]


def training_turns(items: list[Item]) -> list[Turn]:
    """Every item's first turn and, for one item in :data:`FOLLOW_UP_EVERY`, its follow-ups."""
    turns = []
    for item in items:
        turns.append(Turn(item))
        if _hashed("follow", item) % FOLLOW_UP_EVERY == 0:
            turns += follow_ups(item)
    return turns


def _ids(rendered: Any) -> list[int]:
    ids = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
    return [int(i) for i in ids]


def render(tokenizer: Any, turn: Turn, dialect: str | None = None) -> tuple[str, str]:
    """(prompt, reply) text of ``turn`` answered with :meth:`Turn.reply`, through the tokenizer's
    chat template (or our template of ``dialect``): the prompt is what a server renders for the
    request (generation prompt included), the reply what the model is trained to write after it
    (up to ``<|im_end|>``). Our bracket template renders no reasoning before a call."""
    template = None if dialect is None else chat_template(dialect)
    tools = turn.item.tools
    prompt = tokenizer.apply_chat_template(
        turn.messages, tools=tools, add_generation_prompt=True, tokenize=False, chat_template=template
    )
    full = tokenizer.apply_chat_template(
        [*turn.messages, turn.reply()], tools=tools, tokenize=False, chat_template=template
    )
    if not full.startswith(prompt):
        raise ValueError(f"{turn.item.id}: the template's conversation does not extend its generation prompt")
    return prompt, full[len(prompt) :].rstrip("\n")


def build_examples(tokenizer: Any, turns: list[Turn], max_prompt_tokens: int) -> list[Example]:
    """The training sequences of ``turns`` whose prompt fits in ``max_prompt_tokens``."""
    examples = []
    for turn in turns:
        item = turn.item
        prompt, reply = render(tokenizer, turn, dialect_of(item))
        prompt_ids = _ids(tokenizer(prompt, add_special_tokens=False))
        if len(prompt_ids) > max_prompt_tokens:
            continue
        reply_ids = _ids(tokenizer(reply, add_special_tokens=False))
        simple = (
            not turn.done
            and len(item.tools) == 1
            and len(item.target) == 1
            and len(item.target[0].arguments) <= SIMPLE_ARGUMENTS
        )
        examples.append(Example(item.id, prompt_ids, reply_ids, simple))
    return examples


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the weights: the same recipe gives byte-identical files (a fixed
    seed, a fixed step count, a fixed thread count, the kernels' instruction set: never a time
    limit)."""

    steps: int = 1000
    seed: int = 0
    hidden_size: int = 128
    num_layers: int = 4
    intermediate_size: int = 384
    num_heads: int = 4
    num_kv_heads: int = 2
    batch_size: int = 4
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    curriculum: float = 0.2
    """The share of steps drawn from the simple examples only (one tool, one short call)."""
    max_prompt_tokens: int = 640
    threads: int = 1
    """Kernels reduce in another order on another thread count, so it is part of the recipe. One:
    beside another busy process every kernel on two threads waits for the slower one, so one is
    also the fast choice wherever the machine is shared (docs/architecture.md, "Measurements
    behind the code")."""
    silent_weight: float = -1e6
    """The head weight of never-seen tokens on the constant channel (:func:`silence_rows`)."""
    kernels: str = "avx2"
    """The x86 instruction set every kernel trains with (:func:`kernel_env`), so that machines
    with more of it (AVX-512) give the same weights: unpinned they reduce in another order, and
    one such machine trained a model that called with wrong arguments and never answered."""
    data_version: int = DATA_VERSION
    build_version: int = BUILD_VERSION

    def digest(self) -> str:
        """A short hash of every field: the model's name in the artifact cache."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


DEFAULT_RECIPE = Recipe()


def _batches(examples: list[Example], batch_size: int, rng: random.Random) -> Iterator[list[Example]]:
    """Endless batches: each pass shuffled, batches cut from runs of similar length (less padding)."""
    while True:
        order = examples[:]
        rng.shuffle(order)
        chunk = batch_size * 16
        batches = []
        for start in range(0, len(order), chunk):
            run = sorted(order[start : start + chunk], key=lambda e: len(e.prompt) + len(e.reply))
            batches += [run[i : i + batch_size] for i in range(0, len(run), batch_size)]
        rng.shuffle(batches)
        yield from batches


def _tensors(batch: list[Example], pad_id: int) -> tuple[Any, Any, Any]:
    """(input ids, attention mask, target ids with -100 where no loss), right-padded."""
    import torch

    width = max(len(e.prompt) + len(e.reply) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for row, example in enumerate(batch):
        sequence = example.prompt + example.reply
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
        # position t predicts token t + 1: the reply's tokens are predicted from len(prompt) - 1 on
        labels[row, len(example.prompt) - 1 : len(sequence) - 1] = torch.tensor(example.reply)
    return ids, mask, labels


def _new_model(recipe: Recipe, tokenizer: Any, vocab_size: int, pad_id: int) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.hidden_size // recipe.num_heads,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    return Qwen3ForCausalLM(config)


def train(recipe: Recipe, out: Path, items: list[Item] | None = None) -> None:
    """Train the model of ``recipe`` and write it, servable by vLLM, to ``out``.

    Training runs on a compact vocabulary, the tokens the training data holds (about 11k of
    Qwen 3's 151,936 logits): the full softmax over them costs a tenth of the full head, and the
    optimizer never walks 150k idle embedding rows. The trained rows are then put back in place
    in a full-width model; every other head row reads only a reserved constant channel with a
    large negative weight (:func:`pin_silent_channel`, :func:`silence_rows`), so tokens never
    seen get no mass, as in a real model: a head row that got no gradient would keep a logit
    near 0, far above the seen but wrong tokens. The head is untied, so that leaves the input
    embeddings of unseen prompt tokens alone (small, as initialised).

    ``items`` replaces the training split (tests train on a handful of items).
    """
    import torch

    tqdm = importlib.import_module("tqdm").tqdm  # comes with vLLM; no stubs
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer("qwen3", out / "_base_tokenizer")
    tokenizer.save_pretrained(str(out))
    shutil.rmtree(out / "_base_tokenizer")

    examples = build_examples(
        tokenizer, training_turns(training_items() if items is None else items), recipe.max_prompt_tokens
    )
    simple = [e for e in examples if e.simple]
    seen = sorted({t for e in examples for t in (*e.prompt, *e.reply)} | {tokenizer.pad_token_id})
    logger.info("%d training examples (%d simple), %d distinct tokens", len(examples), len(simple), len(seen))
    width = max(len(tokenizer), LOGITS_WIDTH["qwen3"])
    compact = torch.full((width,), -100, dtype=torch.long)
    compact[torch.tensor(seen)] = torch.arange(len(seen))

    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    rng = random.Random(recipe.seed)
    model = _new_model(recipe, tokenizer, len(seen), int(compact[tokenizer.pad_token_id]))
    pin_silent_channel(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(recipe, step))
    first, rest = (
        _batches(simple or examples, recipe.batch_size, rng),
        _batches(examples, recipe.batch_size, rng),
    )
    curriculum_steps = int(recipe.steps * recipe.curriculum)
    with tqdm(range(recipe.steps), desc="training", unit="step") as bar:
        for step in bar:
            batch = next(first if step < curriculum_steps else rest)
            ids, mask, labels = _tensors(batch, tokenizer.pad_token_id)
            hidden = model.model(input_ids=compact[ids], attention_mask=mask).last_hidden_state
            where = labels != -100
            loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[where]), compact[labels[where]])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            pin_silent_channel(model)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    _widen(recipe, tokenizer, model, torch.tensor(seen), width).save_pretrained(
        str(out), safe_serialization=True
    )
    (out / MARKER).write_text(
        json.dumps(
            {
                "recipe": asdict(recipe),
                "digest": recipe.digest(),
                "kernels": torch.backends.cpu.get_cpu_capability(),
            }
        ),
        encoding="utf-8",
    )


def _widen(recipe: Recipe, tokenizer: Any, compact: Any, seen: Any, width: int) -> Any:
    """The full-width model: ``compact``'s layers, its rows at the ``seen`` ids, the rest silent."""
    import torch

    model = _new_model(recipe, tokenizer, width, tokenizer.pad_token_id)
    state = {
        k: v for k, v in compact.state_dict().items() if not k.startswith(("lm_head", "model.embed_tokens"))
    }
    model.load_state_dict(state, strict=False)
    pin_silent_channel(model)
    with torch.no_grad():
        model.model.embed_tokens.weight[seen] = compact.model.embed_tokens.weight
        model.lm_head.weight[seen] = compact.lm_head.weight
    unseen = torch.ones(width, dtype=torch.bool)
    unseen[seen] = False
    silence_rows(model, unseen, recipe.silent_weight)
    return model.eval()


def _lr_factor(recipe: Recipe, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


MARKER = "hermes_vllm_trained.json"


def trained_model_path(recipe: Recipe = DEFAULT_RECIPE) -> Path:
    """The model of ``recipe`` in the artifact cache, trained on first use (minutes)."""
    return unpacked(f"trained-qwen3-{recipe.digest()}", lambda staging: train_apart(recipe, staging))


def kernel_env(kernels: str) -> dict[str, str]:
    """The environment that pins torch's vectorised kernels, MKL's (its conditional numerical
    reproducibility) and oneDNN's to the instruction set ``kernels``. Each reads it when it
    loads, so a process that imported torch already cannot be pinned."""
    isa = kernels.upper()
    return {"ATEN_CPU_CAPABILITY": kernels, "MKL_CBWR": isa, "ONEDNN_MAX_CPU_ISA": isa}


def train_apart(recipe: Recipe, out: Path) -> None:
    """:func:`train` in a process of its own, its kernels pinned (:attr:`Recipe.kernels`)."""
    code = (
        "import json, logging, sys; from pathlib import Path; "
        "from hermes_vllm.demo.trained_model import Recipe, train; "
        "logging.basicConfig(level=logging.INFO, format='%(message)s'); "
        "train(Recipe(**json.loads(sys.argv[1])), Path(sys.argv[2]))"
    )
    env = {**os.environ, **kernel_env(recipe.kernels)}
    subprocess.run([sys.executable, "-c", code, json.dumps(asdict(recipe)), str(out)], env=env, check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out", type=Path, nargs="?", help="also copy the model here (default: the cache only)"
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_RECIPE.steps)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = trained_model_path(replace(DEFAULT_RECIPE, steps=args.steps))
    if args.out is not None:
        shutil.copytree(path, args.out, dirs_exist_ok=True)
        path = args.out
    logger.info("trained model at %s", path)


if __name__ == "__main__":
    main()
