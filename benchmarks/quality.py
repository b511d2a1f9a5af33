"""Does the constraint help a model that tries, and does it ever cost accuracy? Held-out BFCL items.

The same held-out BFCL items (simple, multiple, parallel, live; never trained on:
:func:`hermes_vllm.demo.trained_model.held_out_items`) go to every configuration of one run,
greedy (temperature 0, seed 0), no logit bias:

- ``no parser``: vLLM's server with ``tool_choice="none"`` (the tools still in the prompt):
  the raw text, read as a client would (:func:`support.bfcl_judge.calls_from_text`);
- ``vLLM hermes``: ``--tool-call-parser hermes``, ``auto``;
- ``vLLM strict``: the same with ``--tool-strict-level parameter`` (vLLM's own constraint), ``auto``;
- ``ours auto`` / ``ours required`` / ``ours named`` (the named tool, on the items that expect
  one call);
- ``ours required`` again with ``HERMES_VLLM_MAX_CALL_WHITESPACE`` 0 and 8 (default 1), and with
  ``HERMES_VLLM_CALL_KEY_ORDER=any`` (top-level arguments in any order; default: declared order);
- tools beside a final answer's schema (``+ response_format``: :data:`ANSWER`, what an agent with
  a typed result sends), ``auto``, ``required`` and ``none`` (the turn after a tool result, where
  a client asks for the answer), on vLLM's parsers (``hermes`` with the
  ``qwen3`` reasoning parser too) and ours, side by side with ``auto`` on tools only: replies
  holding a call, replies whose content is an answer valid for the schema, HTTP errors;
- the turns after tool results (:class:`hermes_vllm.demo.trained_model.Turn`, the made-up results
  the model is trained on), ``auto``, on vLLM's ``hermes`` parser (the model unconstrained) and
  ours: after every target call's result an answer is due (text, or with ``+ response_format``
  one valid for :data:`ANSWER`), after the first of several the other calls are; replies that
  call again, answer, or do neither, and the right tool of the calls still due.

``off_order`` counts each configuration's calls whose arguments do not follow the declared order
(the unconstrained ones say whether the model ever wants another order), and
``target_order_differs_from_schema`` the items whose training-style target does.

Per configuration: parse rate, schema-valid rate, right tool, BFCL exact arguments
(:mod:`support.bfcl_judge`), completion tokens per reply, wall time of the batch.
Configurations that differ only per request share a server; each server starts once.

Usage: python benchmarks/quality.py [--items 100] [--model PATH] [--servers a,b] [--configs REGEX] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from support.bfcl_judge import ParsedCall, Verdict, calls_from_text, judge

from hermes_vllm.demo.trained_model import Item, Turn, held_out_items

logger = logging.getLogger("quality")

STOCK = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
OURS = (
    *("--enable-auto-tool-choice", "--tool-call-parser", "hermes_vllm_qwen"),
    *("--reasoning-parser", "hermes_vllm_qwen"),
)
"""Our parsers in Qwen 3's dialect (``name`` first), the trained model's."""
BRACKETS = (
    *("--enable-auto-tool-choice", "--tool-call-parser", "hermes_vllm_brackets"),
    *("--reasoning-parser", "hermes_vllm_brackets"),
)
"""Our parsers in the bracket dialect, served with our bracket template (vLLM has no parser for it)."""
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
"""The final answer's schema of the ``+ response_format`` configurations."""
WITH_ANSWER = "+answer"
"""A tool choice ending so is sent with :data:`ANSWER` as ``response_format``."""
AFTER_ALL = "@after_all"
"""A tool choice ending so is asked in the turn after every target call's result: an answer is due."""
AFTER_FIRST = "@after_first"
"""A tool choice ending so is asked, on the items of several calls, in the turn after the first
call's result: the other calls are due."""


@dataclass(frozen=True)
class Server:
    """One server start: its flags and environment, and the configurations sent to it."""

    flags: tuple[str, ...]
    env: dict[str, str]
    configs: tuple[tuple[str, str], ...]
    """(label, tool choice) pairs: ``none``, ``auto``, ``required`` or ``named``, the last three
    also with :data:`WITH_ANSWER`."""
    template: str | None = None
    """The dialect whose template of ours renders the prompts (``--chat-template``); None: the
    model's own (Qwen 3's, ``<tool_call>``)."""


def _answered(label: str) -> tuple[tuple[str, str], ...]:
    """The configurations of a typed answer beside the tools."""
    return ((f"{label} auto + response_format", "auto" + WITH_ANSWER),
            (f"{label} required + response_format", "required" + WITH_ANSWER),
            (f"{label} none + response_format", "none" + WITH_ANSWER))  # fmt: skip


def _after(label: str, *, answer: bool = False) -> tuple[tuple[str, str], ...]:
    """The configurations of the turns after tool results (``auto``)."""
    rows = [(f"{label} auto, after all results", "auto" + AFTER_ALL),
            (f"{label} auto, after the first of several", "auto" + AFTER_FIRST)]  # fmt: skip
    if answer:
        rows.append((f"{label} auto + response_format, after all results", "auto" + WITH_ANSWER + AFTER_ALL))
    return tuple(rows)


SERVERS: dict[str, Server] = {
    "vllm_hermes": Server(
        STOCK, {}, (("no parser", "none"), ("vLLM hermes", "auto"), *_after("vLLM hermes"))
    ),
    "vllm_strict": Server(
        (*STOCK, "--tool-strict-level", "parameter"), {}, (("vLLM strict", "auto"), *_answered("vLLM strict"))
    ),
    "vllm_hermes_qwen3": Server(
        (*STOCK, "--reasoning-parser", "qwen3"),
        {},
        (("vLLM hermes+qwen3 auto", "auto"), *_answered("vLLM hermes+qwen3")),
    ),
    "ours": Server(
        OURS,
        {},
        (
            *(("ours auto", "auto"), ("ours required", "required"), ("ours named", "named")),
            *_answered("ours"),
            *_after("ours", answer=True),
        ),
    ),
    "ours_ws0": Server(OURS, {"HERMES_VLLM_MAX_CALL_WHITESPACE": "0"}, (("ours required ws0", "required"),)),
    "ours_ws8": Server(OURS, {"HERMES_VLLM_MAX_CALL_WHITESPACE": "8"}, (("ours required ws8", "required"),)),
    "ours_any_order": Server(
        OURS, {"HERMES_VLLM_CALL_KEY_ORDER": "any"}, (("ours required any order", "required"),)
    ),
    "ours_brackets": Server(
        BRACKETS,
        {},
        (
            ("no parser, brackets", "none"),
            ("ours brackets auto", "auto"),
            ("ours brackets required", "required"),
        ),
        template="chatml-brackets",
    ),
}
GROUPS: dict[str, tuple[str, ...]] = {
    "simple": ("simple_python",),
    "multiple": ("multiple",),
    "parallel": ("parallel", "parallel_multiple"),
    "live": ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"),
}


def group_of(item: Item) -> str:
    return next(g for g, categories in GROUPS.items() if item.category in categories)


def _interleaved(lists: Sequence[list[Item]]) -> list[Item]:
    """The lists' items taken in turn, one from each list that has any left."""
    out: list[Item] = []
    for row in itertools.zip_longest(*lists):
        out += [i for i in row if i is not None]
    return out


def pick_items(count: int, fits: Callable[[Item], bool]) -> list[Item]:
    """``count`` held-out items that ``fits`` admits, taken in turn from each group, and within a
    group in turn from each of its BFCL files (file order)."""
    admitted = [i for i in held_out_items() if fits(i)]
    pools = {
        g: _interleaved([[i for i in admitted if i.category == c] for c in categories])
        for g, categories in GROUPS.items()
    }
    picked: list[Item] = []
    while len(picked) < count and any(pools.values()):
        for pool in pools.values():
            if pool and len(picked) < count:
                picked.append(pool.pop(0))
    return picked


@dataclass
class Outcome:
    """One reply, judged."""

    item: str
    group: str
    verdict: Verdict
    tokens: int
    seconds: float
    shown: str
    calls: int = 0
    off_order: int = 0
    """Calls whose arguments do not follow their tool's declared property order."""
    answered: bool = False
    """The reply's content is an answer valid for :data:`ANSWER` (``+ response_format`` only)."""
    status: int = 200
    """The HTTP status (an error's, or 200)."""


@dataclass
class Result:
    """One configuration's outcomes and its batch's wall time."""

    label: str
    server: str
    tool_choice: str
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        n = len(self.outcomes)

        def rate(pick: Callable[[Verdict], bool], outcomes: Sequence[Outcome] | None = None) -> float:
            chosen = self.outcomes if outcomes is None else outcomes
            return round(sum(pick(o.verdict) for o in chosen) / len(chosen), 4) if chosen else 0.0

        groups = {
            g: {
                "items": len(picked),
                "valid": rate(lambda v: v.valid, picked),
                "right_tool": rate(lambda v: v.right_tool, picked),
                "exact": rate(lambda v: v.exact, picked),
            }
            for g in GROUPS
            if (picked := [o for o in self.outcomes if o.group == g])
        }
        return {
            "server": self.server,
            "tool_choice": self.tool_choice,
            "items": n,
            "parse": rate(lambda v: v.parsed),
            "valid": rate(lambda v: v.valid),
            "right_tool": rate(lambda v: v.right_tool),
            "exact": rate(lambda v: v.exact),
            "calls": sum(o.calls for o in self.outcomes),
            "off_order": sum(o.off_order for o in self.outcomes),
            "http_errors": sum(o.verdict.problem.startswith("HTTP error") for o in self.outcomes),
            "http_500": sum(o.status >= 500 for o in self.outcomes),
            "with_call": sum(o.calls > 0 for o in self.outcomes),
            "answered": sum(o.answered for o in self.outcomes),
            "neither": sum(o.calls == 0 and not o.answered for o in self.outcomes),
            "tokens_per_reply": round(statistics.mean(o.tokens for o in self.outcomes), 1) if n else 0.0,
            "reply_s_mean": round(statistics.mean(o.seconds for o in self.outcomes), 3) if n else 0.0,
            "wall_s": round(self.wall_s, 1),
            "groups": groups,
            "examples": [
                {"item": o.item, "problem": o.verdict.problem, "reply": o.shown[:300]}
                for o in self.outcomes
                if not o.verdict.exact
            ][:4],
        }


def turn_of(item: Item, choice: str) -> Turn:
    """The turn of ``item`` that ``choice`` asks: the first, or one after tool results."""
    if choice.endswith(AFTER_ALL):
        return Turn(item, len(item.target))
    return Turn(item, 1) if choice.endswith(AFTER_FIRST) else Turn(item)


def asks(item: Item, choice: str) -> bool:
    """Whether ``choice`` is asked of ``item``: a named tool of one-call items, the turn after the
    first call of items of several."""
    if choice.startswith("named"):
        return len(item.expected_names) == 1
    return len(item.target) > 1 if choice.endswith(AFTER_FIRST) else True


def tool_choice_field(item: Item, choice: str) -> Any:
    choice = choice.removesuffix(AFTER_ALL).removesuffix(AFTER_FIRST).removesuffix(WITH_ANSWER)
    if choice == "named":
        return {"type": "function", "function": {"name": item.expected_names[0]}}
    return choice


def ask(client: Any, model: str, item: Item, *, choice: str, max_tokens: int, dialect: str) -> Outcome:
    """Send ``item`` once and judge the reply; an HTTP error is a reply with no call."""
    from openai import APIError

    started = time.monotonic()
    answer = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    turn = turn_of(item, choice)
    with_answer = WITH_ANSWER in choice
    try:
        reply = client.chat.completions.create(
            model=model,
            messages=turn.messages,
            tools=item.tools,
            tool_choice=tool_choice_field(item, choice),
            max_tokens=max_tokens,
            temperature=0.0,
            seed=0,
            **({"response_format": answer} if with_answer else {}),
        )
    except APIError as err:
        verdict = Verdict(False, False, False, False, f"HTTP error: {err}")
        status = int(getattr(err, "status_code", 500))
        return Outcome(item.id, group_of(item), verdict, 0, time.monotonic() - started, "", status=status)
    seconds = time.monotonic() - started
    message = reply.choices[0].message
    if choice == "none":
        calls = calls_from_text(message.content or "", dialect)
    else:
        calls = [
            ParsedCall(c.function.name, c.function.arguments)
            for c in message.tool_calls or []
            if getattr(c, "function", None) is not None
        ]
    due = turn.next_calls
    verdict = judge(calls, item.schemas, [c.name for c in due], item.possible_answers[turn.done :])
    shown = " ".join(f"{c.name}({c.arguments})" for c in calls) or json.dumps(message.content or "")
    tokens = reply.usage.completion_tokens if reply.usage else 0
    off = sum(not declared_order(item.schemas.get(c.name, {}), c.arguments) for c in calls)
    content = message.content or ""
    if turn.done:  # after tool results: an answer is a reply of no call with text (valid, when a schema)
        answered = not calls and (is_answer(content) if with_answer else bool(content.strip()))
    else:
        answered = with_answer and is_answer(content)
    return Outcome(item.id, group_of(item), verdict, tokens, seconds, shown, len(calls), off, answered)


def is_answer(content: str) -> bool:
    """Whether ``content`` is an answer valid for :data:`ANSWER`."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(content), ANSWER)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def declared_order(schema: dict[str, Any], arguments: str) -> bool:
    """Whether the arguments' JSON text writes the schema's properties in declared order (text that
    is no JSON object has no order to judge)."""
    try:
        keys = list(json.loads(arguments))
    except (json.JSONDecodeError, TypeError):
        return True
    declared = [k for k in schema.get("properties", {}) if k in keys]
    return [k for k in keys if k in declared] == declared


def serve(
    name: str, model: str, items: Sequence[Item], max_tokens: int, workers: int, only: str = ""
) -> list[Result]:
    """Start server ``name`` once and send it every item under each of its configurations (those
    whose label the regular expression ``only`` finds, when given)."""
    from openai import OpenAI

    from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
    from hermes_vllm.formats.chat_template import chat_template

    server = SERVERS[name]
    started = time.monotonic()
    results = []
    flags = [*CPU_ARGS, "--seed", "0", *server.flags]
    with tempfile.TemporaryDirectory() as folder:
        if server.template is not None:
            template = Path(folder) / f"{server.template}.jinja"
            template.write_text(chat_template(server.template), encoding="utf-8")
            flags += ["--chat-template", str(template)]
        with openai_server(model, flags, {**CPU_ENV, **server.env}) as url:
            logger.info("%s up in %.0f s", name, time.monotonic() - started)
            client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
            for label, choice in server.configs:
                if only and not re.search(only, label):
                    continue
                asked = [i for i in items if asks(i, choice)]
                result = Result(label, name, choice)
                begun = time.monotonic()
                one = partial(
                    ask,
                    client,
                    model,
                    choice=choice,
                    max_tokens=max_tokens,
                    dialect=server.template or "qwen",
                )
                with ThreadPoolExecutor(max_workers=workers) as pool:
                    result.outcomes = list(pool.map(one, asked))
                result.wall_s = time.monotonic() - begun
                summary = result.summary()
                logger.info(
                    "%s: %d items, valid %.2f, right tool %.2f, exact %.2f, %.0f s",
                    *(label, len(asked), summary["valid"], summary["right_tool"], summary["exact"]),
                    result.wall_s,
                )
                results.append(result)
    return results


def order_differs(item: Item) -> bool:
    """Whether some target call writes its arguments in another order than its schema declares."""
    for call in item.target:
        declared = [k for k in item.schemas[call.name].get("properties", {}) if k in call.arguments]
        if declared != list(call.arguments):
            return True
    return False


ANSWER_COLUMNS = {
    "items": "items",
    "with a call": "with_call",
    "answer valid": "answered",
    "neither": "neither",
    "HTTP errors": "http_errors",
    "of them 500": "http_500",
}
"""The counts of the tools + ``response_format`` table: column -> summary key."""
AFTER_COLUMNS = {"items": "items", "calls again": "with_call", "answers": "answered", "neither": "neither"}
"""The counts of the table of the turns after tool results: column -> summary key."""


def markdown(summaries: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| configuration | items | parse | schema-valid | right tool | exact args | calls off declared order "
        "| tokens/reply | wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, s in summaries.items():
        lines.append(
            f"| {label} | {s['items']} | {s['parse']:.0%} | {s['valid']:.0%} | {s['right_tool']:.0%} "
            f"| {s['exact']:.0%} | {s['off_order']}/{s['calls']} | {s['tokens_per_reply']:.0f} "
            f"| {s['wall_s']:.0f} |"
        )
    after = {label: s for label, s in summaries.items() if "@" in s["tool_choice"]}
    answering = {
        label: s for label, s in summaries.items() if WITH_ANSWER in s["tool_choice"] and label not in after
    }
    counted = (
        ("tools + response_format", answering, ANSWER_COLUMNS),
        ("after tool results", after, AFTER_COLUMNS),
    )
    for title, chosen, columns in counted:
        if chosen:
            lines += ["", f"| {title} | {' | '.join(columns)} |", "| --- |" + " ---: |" * len(columns)]
            lines += [
                f"| {label} | {' | '.join(str(s[key]) for key in columns.values())} |"
                for label, s in chosen.items()
            ]
    return "\n".join(lines) + "\n"


def plot(summaries: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ("parse", "valid", "right_tool", "exact")
    labels = list(summaries)
    fig, ax = plt.subplots(figsize=(max(8, len(labels) * 1.1), 4.5))
    width = 0.8 / len(metrics)
    for k, metric in enumerate(metrics):
        xs = [i + (k - (len(metrics) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, [summaries[lb][metric] * 100 for lb in labels], width, label=metric.replace("_", " "))
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("% of replies")
    ax.set_ylim(0, 100)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def default_model() -> str:
    """The trained model's served directory (trained on first use, then cached)."""
    from hermes_vllm.demo import trained_model

    return str(trained_model.trained_model_path())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100, help="held-out items (default 100)")
    parser.add_argument("--model", default=None, help="served model dir (default: the trained model)")
    parser.add_argument("--servers", default=",".join(SERVERS), help=f"subset of {','.join(SERVERS)}")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--workers", type=int, default=8, help="requests in flight per configuration")
    parser.add_argument("--configs", default="", help="only the configurations whose label this regex finds")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from transformers import AutoTokenizer

    from hermes_vllm.demo.server import CPU_ARGS

    model = args.model or default_model()
    tokenizer = AutoTokenizer.from_pretrained(model)
    context = int(CPU_ARGS[CPU_ARGS.index("--max-model-len") + 1])

    def fits(item: Item) -> bool:
        longest = Turn(item, len(item.target)).messages  # the turn after every result, the longest asked
        ids = tokenizer.apply_chat_template(longest, tools=item.tools, add_generation_prompt=True)
        return bool(len(ids) + args.max_tokens <= context)

    items = pick_items(args.items, fits)
    names = [n for n in args.servers.split(",") if n]
    unknown = set(names) - set(SERVERS)
    if unknown:
        parser.error(f"unknown servers: {', '.join(sorted(unknown))}")
    started = time.monotonic()
    results: list[Result] = []
    table = ""
    for name in names:  # written after each server: a run cut short keeps what it measured
        results += serve(name, model, items, args.max_tokens, args.workers, args.configs)
        table = write(args.out, model, items, results, args.max_tokens, time.monotonic() - started)
    print(table)


def write(
    out: Path, model: str, items: Sequence[Item], results: Sequence[Result], max_tokens: int, total_s: float
) -> str:
    """``quality.json``, ``quality.md`` and ``quality.png`` of the results so far; the table."""
    summaries = {r.label: r.summary() for r in results}
    report = {
        "model": model,
        "items": [i.id for i in items],
        "groups": {g: sum(group_of(i) == g for i in items) for g in GROUPS},
        "one_tool_offered": sum(len(i.tools) == 1 for i in items),
        "target_order_differs_from_schema": sum(map(order_differs, items)),
        "max_tokens": max_tokens,
        "sampling": "temperature 0, seed 0, no logit bias",
        "total_s": round(total_s, 1),
        "configs": summaries,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    table = markdown(summaries)
    (out / "quality.md").write_text(table, encoding="utf-8")
    title = f"{len(items)} held-out BFCL items, {Path(model).name}, greedy, no logit bias"
    plot(summaries, out / "quality.png", title)
    return table


if __name__ == "__main__":
    main()
