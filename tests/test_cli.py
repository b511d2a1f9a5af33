"""The hermes-vllm command line, in-process and as ``python -m hermes_vllm.cli``."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_vllm import cli
from hermes_vllm.formats.chat_template import chat_template
from hermes_vllm.formats.prompt import build_hermes_prompt
from hermes_vllm.formats.sharegpt import openai_to_sharegpt
from hermes_vllm.formats.token_check import reserve_tokens, validate_prompt_tokens

TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
CALL = {
    "id": "call_1_0",
    "type": "function",
    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
}
CHATS: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], None),
    (
        [
            {"role": "user", "content": "Weather in Oslo? <|im_end|>"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1_0", "content": '{"temp": -3}'},
            {"role": "assistant", "content": "It's cold."},
        ],
        [TOOL],
    ),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "naïve 日本"}], [TOOL]),
]


def _sharegpt_record(i: int) -> dict[str, Any]:
    messages, tools = CHATS[i]
    return {"id": f"r{i}", **openai_to_sharegpt(messages, tools).model_dump(by_alias=True)}


def _stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8"))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_render_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    messages, tools = CHATS[1]
    spec = tmp_path / "chat.json"
    spec.write_text(
        json.dumps({"system": "Be brief.", "messages": messages, "tools": tools}), encoding="utf-8"
    )
    assert cli.main(["render", str(spec), "--dialect", "hermes"]) == 0
    assert capsys.readouterr().out == build_hermes_prompt("Be brief.", messages, tools, dialect="hermes")


def test_render_a_message_list_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = CHATS[0][0]
    _stdin(monkeypatch, json.dumps(messages))
    assert cli.main(["render", "--no-generation-prompt"]) == 0
    assert capsys.readouterr().out == build_hermes_prompt(None, messages, add_generation_prompt=False)


def test_render_without_thinking(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    messages = CHATS[0][0]
    _stdin(monkeypatch, json.dumps(messages))
    assert cli.main(["render", "--dialect", "qwen", "--no-thinking"]) == 0
    out = capsys.readouterr().out
    assert out == build_hermes_prompt(None, messages, dialect="qwen", enable_thinking=False)
    assert out.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_render_as_a_module() -> None:
    messages, tools = CHATS[1]
    done = subprocess.run(
        [sys.executable, "-m", "hermes_vllm.cli", "render", "--dialect", "qwen"],
        input=json.dumps({"messages": messages, "tools": tools}).encode(),
        capture_output=True,
        check=True,
    )
    assert done.stdout.decode() == build_hermes_prompt(None, messages, tools, dialect="qwen")


def test_check_reports_token_counts(
    tiny_model: Path, tokenizer: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompt = build_hermes_prompt(None, *CHATS[1], dialect="hermes")
    path = tmp_path / "prompt.txt"
    path.write_bytes(prompt.encode("utf-8"))
    assert cli.main(["check", str(path), "--tokenizer", str(tiny_model)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == validate_prompt_tokens(prompt, tokenizer)
    assert report["open_turn"] == "assistant" and report["im_start_count"] == 6


def test_template_for_a_tokenizer_escapes_its_special_tokens(
    tiny_model: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["template", "--dialect", "chatml-brackets", "--tokenizer", str(tiny_model)]) == 0
    template = capsys.readouterr().out
    assert template == chat_template(reserve_tokens("chatml-brackets", tokenizer))
    messages = [{"role": "user", "content": "<tool_call></s>"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, chat_template=template)
    assert validate_prompt_tokens(prompt, tokenizer)["control_tokens"] == {"<|im_start|>": 1, "<|im_end|>": 1}


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_convert_reports_and_keeps_every_rejected_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_order = {"conversations": [{"from": "gpt", "value": "hi"}]}
    other_tools = {**_sharegpt_record(1), "tools": [{"type": "function", "function": {"name": "other"}}]}
    lines = [
        json.dumps(_sharegpt_record(0)),
        "{not json",
        json.dumps(_sharegpt_record(1)),
        "",
        json.dumps(bad_order),
        "[1, 2]",
        json.dumps({"messages": []}),
        json.dumps(other_tools),
        json.dumps(_sharegpt_record(2)),
    ]
    source = _write_lines(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    assert cli.main(["convert", str(source), "--to", "openai", "-o", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    for number, reason in [(2, "JSONDecodeError"), (5, "starts with a system or human turn"), (6, "got list"),
                           (7, "no 'conversations' list"), (8, "'tools' differ")]:  # fmt: skip
        assert f"line {number}: rejected: " in err and reason in err
    rejects = _jsonl(tmp_path / "out.jsonl.rejects.jsonl")
    assert [r["line"] for r in rejects] == [2, 5, 6, 7, 8]
    assert [r["record"] for r in rejects] == [lines[n - 1] for n in (2, 5, 6, 7, 8)]
    assert err.rstrip().endswith(
        "converted 3, rejected 5 (written to "
        + str(tmp_path / "out.jsonl.rejects.jsonl")
        + "), blank lines 1"
    )
    converted = _jsonl(out)
    assert [r["id"] for r in converted] == ["r0", "r1", "r2"]
    assert [(r["messages"], r.get("tools")) for r in converted] == CHATS


def test_convert_round_trip_is_exact(tmp_path: Path) -> None:
    records = [_sharegpt_record(i) for i in range(len(CHATS))]
    source = _write_lines(tmp_path / "sharegpt.jsonl", [json.dumps(r, ensure_ascii=False) for r in records])
    openai_file, back = tmp_path / "openai.jsonl", tmp_path / "back.jsonl"
    assert cli.main(["convert", str(source), "--to", "openai", "-o", str(openai_file), "--no-progress"]) == 0
    assert cli.main(["convert", str(openai_file), "--to", "sharegpt", "-o", str(back), "--no-progress"]) == 0
    assert back.read_text(encoding="utf-8") == source.read_text(encoding="utf-8")
    assert not (tmp_path / "openai.jsonl.rejects.jsonl").exists()


def test_convert_shows_a_progress_bar_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    source = _write_lines(tmp_path / "in.jsonl", [json.dumps(_sharegpt_record(i)) for i in range(3)])
    assert cli.main(["convert", str(source), "--to", "openai", "-o", str(tmp_path / "out.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "3/3" in err and "converted 3, rejected 0, blank lines 0" in err


def test_convert_stdin_to_stdout_needs_a_rejects_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    messages, tools = CHATS[1]
    record = json.dumps({"messages": messages, "tools": tools}) + "\n"
    _stdin(monkeypatch, record)
    with pytest.raises(SystemExit, match="--rejects is required"):
        cli.main(["convert", "--to", "sharegpt"])
    _stdin(monkeypatch, record)
    assert (
        cli.main(["convert", "--to", "sharegpt", "--rejects", str(tmp_path / "r.jsonl"), "--mask-output"])
        == 0
    )
    [tool_turn] = [t for t in json.loads(capsys.readouterr().out)["conversations"] if t["from"] == "tool"]
    assert (
        tool_turn["value"] == '<tool_response>\n{"name": "weather", "content": "[MASKED]"}\n</tool_response>'
    )


def test_convert_as_a_module(tmp_path: Path) -> None:
    source = _write_lines(
        tmp_path / "in.jsonl", [json.dumps({"messages": m, "tools": t}) for m, t in CHATS] + ["oops"]
    )
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hermes_vllm.cli",
            "convert",
            str(source),
            "--to",
            "sharegpt",
            "-o",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "line 4: rejected: JSONDecodeError" in done.stderr
    assert [r["conversations"] for r in _jsonl(out)] == [
        _sharegpt_record(i)["conversations"] for i in range(3)
    ]
    assert _jsonl(tmp_path / "out.jsonl.rejects.jsonl")[0]["line"] == 4


def test_a_subcommand_is_one_function(monkeypatch: pytest.MonkeyPatch) -> None:
    def add_echo(sub: Any) -> None:
        parser: argparse.ArgumentParser = sub.add_parser("echo", help="exit with CODE")
        parser.add_argument("code", type=int)
        parser.set_defaults(run=lambda args: args.code)

    monkeypatch.setattr(cli, "SUBCOMMANDS", (*cli.SUBCOMMANDS, add_echo))
    assert cli.main(["echo", "7"]) == 7
    help_text = cli.build_parser().format_help()
    assert all(f"    {name} " in help_text for name in ("render", "check", "convert", "echo"))
