"""``hermes-vllm``: render prompts, check them against a tokenizer, convert datasets.

Each subcommand is one ``_add_*`` function that declares its arguments and the function that
runs it; adding a subcommand means writing one and listing it in :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any, TypeAlias

from hermes_vllm.dialect import DEFAULT_DIALECT, Dialect, available_dialects

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _read_text(path: str) -> str:
    """The exact text of ``path`` (``-`` is stdin): no newline translation."""
    data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    return data.decode("utf-8")


def _dialect_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--dialect", choices=available_dialects(), default=default, help=f"default {default}")


def _run_render(args: argparse.Namespace) -> int:
    from hermes_vllm.formats.prompt import build_hermes_prompt

    data = json.loads(_read_text(args.input))
    spec: dict[str, Any] = {"messages": data} if isinstance(data, list) else data
    prompt = build_hermes_prompt(
        spec.get("system"),
        spec["messages"],
        spec.get("tools"),
        add_generation_prompt=not args.no_generation_prompt,
        dialect=args.dialect,
        enable_thinking=not args.no_thinking,
    )
    sys.stdout.write(prompt)
    return 0


def _add_render(sub: SubParsers) -> None:
    p = sub.add_parser(
        "render",
        help="render OpenAI messages (+ tools) as a ChatML prompt",
        description="Input: a JSON list of messages, or an object with 'messages' and optional "
        "'tools' and 'system'. The prompt goes to stdout.",
    )
    p.add_argument("input", nargs="?", default="-", help="JSON file (default: stdin)")
    _dialect_option(p, "chatml-brackets")
    p.add_argument("--no-generation-prompt", action="store_true", help="do not open an assistant turn")
    p.add_argument(
        "--no-thinking",
        action="store_true",
        help="enable_thinking=False: an empty reasoning span opens the answer (dialects with a switch: qwen)",
    )
    p.set_defaults(run=_run_render)


def _run_check(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from hermes_vllm.formats.token_check import validate_prompt_tokens

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    report = validate_prompt_tokens(_read_text(args.prompt), tokenizer, args.dialect)
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    return 0


def _add_check(sub: SubParsers) -> None:
    p = sub.add_parser("check", help="count the turn-marker tokens of a prompt (JSON report on stdout)")
    p.add_argument("prompt", nargs="?", default="-", help="prompt text file (default: stdin)")
    p.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer directory or id")
    _dialect_option(p, DEFAULT_DIALECT)
    p.set_defaults(run=_run_check)


def _take_list(record: dict[str, Any], key: str) -> Any:
    if not isinstance(record.get(key), list):
        raise ValueError(f"the record has no {key!r} list")
    return record.pop(key)


def _to_openai(record: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from hermes_vllm.formats.sharegpt import ShareGPTConversation, sharegpt_to_openai

    conversation = ShareGPTConversation.model_validate(
        {"conversations": _take_list(record, "conversations")}, context={"dialect": args.dialect}
    )
    messages, tools = sharegpt_to_openai(conversation, args.dialect, args.mask_output)
    if tools is not None:
        if record.get("tools", tools) != tools:
            raise ValueError("the record's 'tools' differ from those its system turn announces")
        record["tools"] = tools
    return {**record, "messages": messages}


def _to_sharegpt(record: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from hermes_vllm.formats.sharegpt import openai_to_sharegpt

    messages = _take_list(record, "messages")
    conversation = openai_to_sharegpt(messages, record.pop("tools", None), args.dialect, args.mask_output)
    return {**record, **conversation.model_dump(by_alias=True)}


def _progress(lines: Iterable[str], total: int | None, enabled: bool) -> Iterable[str]:
    """A tqdm bar on stderr when tqdm is installed (it comes with vLLM); plain lines otherwise."""
    if not enabled:
        return lines
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:
        return lines
    bar: Iterable[str] = tqdm(lines, total=total, unit="rec", file=sys.stderr)
    return bar


def _count_lines(path: str) -> int | None:
    if path == "-":
        return None
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def _rejects_path(args: argparse.Namespace) -> Path:
    if args.rejects:
        return Path(args.rejects)
    named = args.output if args.output != "-" else args.input
    if named == "-":
        raise SystemExit("hermes-vllm convert: --rejects is required when reading stdin and writing stdout")
    return Path(named + ".rejects.jsonl")


def _convert_record(line: str, args: argparse.Namespace) -> dict[str, Any]:
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError(f"a record is a JSON object, got {type(record).__name__}")
    return _to_openai(record, args) if args.to == "openai" else _to_sharegpt(record, args)


def _run_convert(args: argparse.Namespace) -> int:
    rejects_path = _rejects_path(args)
    converted = rejected = blank = 0
    with ExitStack() as stack:
        source = sys.stdin if args.input == "-" else stack.enter_context(open(args.input, encoding="utf-8"))
        sink = (
            sys.stdout
            if args.output == "-"
            else stack.enter_context(open(args.output, "w", encoding="utf-8"))
        )
        rejects: IO[str] | None = None
        lines = _progress(source, _count_lines(args.input), not args.no_progress)
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                blank += 1
                continue
            try:
                out = _convert_record(line, args)
            except (ValueError, TypeError) as e:  # pydantic's ValidationError is a ValueError
                reason = " ".join(f"{type(e).__name__}: {e}".split())
                print(f"line {number}: rejected: {reason}", file=sys.stderr)
                if rejects is None:
                    rejects = stack.enter_context(rejects_path.open("w", encoding="utf-8"))
                rejects.write(json.dumps({"line": number, "error": reason, "record": line.rstrip("\n")}))
                rejects.write("\n")
                rejected += 1
                continue
            sink.write(json.dumps(out, ensure_ascii=False) + "\n")
            converted += 1
    where = f" (written to {rejects_path})" if rejected else ""
    print(f"converted {converted}, rejected {rejected}{where}, blank lines {blank}", file=sys.stderr)
    return 1 if rejected else 0


def _add_convert(sub: SubParsers) -> None:
    p = sub.add_parser(
        "convert",
        help="convert ShareGPT JSONL <-> OpenAI JSONL",
        description="Each invalid record is reported with its line number and written to the rejects "
        "file; the exit status is 1 when any record was rejected. Keys other than the conversation "
        "are copied through.",
    )
    p.add_argument("input", nargs="?", default="-", help="JSONL file (default: stdin)")
    p.add_argument("--to", choices=("openai", "sharegpt"), required=True)
    p.add_argument("-o", "--output", default="-", help="JSONL file (default: stdout)")
    p.add_argument(
        "--rejects",
        help="JSONL of rejected records (default: OUTPUT.rejects.jsonl, else INPUT.rejects.jsonl)",
    )
    _dialect_option(p, DEFAULT_DIALECT)
    p.add_argument("--mask-output", action="store_true", help="replace every tool result with [MASKED]")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=_run_convert)


def _run_template(args: argparse.Namespace) -> int:
    from hermes_vllm.formats.chat_template import chat_template

    dialect: str | Dialect = args.dialect
    if args.tokenizer:
        from transformers import AutoTokenizer

        from hermes_vllm.formats.token_check import reserve_tokens

        dialect = reserve_tokens(dialect, AutoTokenizer.from_pretrained(args.tokenizer))
    sys.stdout.write(chat_template(dialect))
    return 0


def _add_template(sub: SubParsers) -> None:
    p = sub.add_parser(
        "template",
        help="print a dialect's Jinja chat template (for vLLM's --chat-template)",
    )
    _dialect_option(p, "hermes")
    p.add_argument(
        "--tokenizer",
        help="Hugging Face tokenizer directory or id: also escape every added or special token of it "
        "(</s>, [INST], ...) in message text",
    )
    p.set_defaults(run=_run_template)


def _add_demo(sub: SubParsers) -> None:
    from hermes_vllm import demo

    p = sub.add_parser("demo", help=demo.HELP, description=demo.DESCRIPTION)
    demo.add_arguments(p)
    p.set_defaults(run=demo.run_args)


SUBCOMMANDS: tuple[Callable[[SubParsers], None], ...] = (
    _add_render,
    _add_check,
    _add_convert,
    _add_template,
    _add_demo,
)
"""One function per subcommand, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hermes-vllm", description="Hermes ChatML tool-call formats for vLLM."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
