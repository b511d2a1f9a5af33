"""Every script in ``examples/``, run as a user runs it: a subprocess against ``make serve``'s server.

The server is ``python -m hermes_vllm.demo.serve`` (what ``make serve`` runs) on the trained model
(:mod:`hermes_vllm.demo.trained_model`), one per module, in the model's own dialect; the bracket
example gets its own ``--dialect chatml-brackets`` server first, and the offline example runs
before any server (one engine at a time). Each example is given only ``OPENAI_BASE_URL`` (the
model name is its default, the served one) and judged by what it prints: every printed call names
the example's own tool and its arguments validate against that tool's schema; every typed answer
validates against the example's own pydantic model, after the tool ran (it prints ``called ...``).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest

from hermes_vllm.demo.server import CPU_ENV, _stop, free_port, spawn
from hermes_vllm.demo.trained_model import trained_model_path

pytestmark = pytest.mark.server

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STARTUP_S = 600.0
"""Time for ``make serve`` to answer, the model already trained."""
EXAMPLE_S = 600.0


@contextmanager
def make_serve(dialect: str, log: Path) -> Iterator[str]:
    """``make serve DIALECT=dialect`` on a free port; yields the base URL it prints."""
    trained_model_path()  # trained here on a new machine (minutes), not inside the startup timeout
    port = free_port()
    cmd = [sys.executable, "-m", "hermes_vllm.demo.serve", "--port", str(port), "--dialect", dialect]
    with log.open("wb") as out:
        proc = spawn(cmd, os.environ, out)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + STARTUP_S
        while f"at {url}" not in log.read_text(encoding="utf-8", errors="replace"):
            assert proc.poll() is None, f"make serve exited:\n{log.read_text(encoding='utf-8')[-4000:]}"
            assert time.monotonic() < deadline, (
                f"make serve silent:\n{log.read_text(encoding='utf-8')[-4000:]}"
            )
            time.sleep(1)
        yield url
    finally:
        _stop(proc, 30.0)


def constant(name: str, variable: str) -> Any:
    """A literal the example assigns to ``variable``, read without importing it (and vLLM with it)."""
    for node in ast.parse((EXAMPLES / f"{name}.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == variable for t in targets):
            return ast.literal_eval(value)
    raise AssertionError(f"{name}.py assigns no {variable}")


def example(name: str) -> ModuleType:
    """The example's module, imported without running it: its tools and output types judge it."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(name: str, url: str | None) -> list[str]:
    """Run ``examples/<name>.py`` with ``url`` as ``OPENAI_BASE_URL``; its output lines."""
    env = {**os.environ, **CPU_ENV}
    if url is not None:
        env["OPENAI_BASE_URL"] = url
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_S,
        check=False,
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout.splitlines()


def calls(lines: list[str]) -> list[dict[str, Any]]:
    """The JSON objects the example printed, one a line."""
    return [json.loads(line) for line in lines if line.startswith("{")]


def check_calls(printed: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
    """At least one call; each names one of ``tools`` and its arguments validate against it."""
    assert printed, "no call printed"
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in printed:
        assert call["name"] in schemas, call
        jsonschema.validate(call["arguments"], schemas[call["name"]])


def test_offline_writes_a_valid_call() -> None:
    check_calls(calls(run("offline", None)), [constant("offline", "TRIANGLE_AREA")])


def test_the_bracket_dialect_example_gets_a_valid_call(tmp_path: Path) -> None:
    with make_serve("chatml-brackets", tmp_path / "serve.log") as url:
        check_calls(calls(run("brackets", url)), [constant("brackets", "CIRCLE_AREA")])


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with make_serve("qwen", tmp_path_factory.mktemp("serve") / "serve.log") as served:
        yield served


@pytest.mark.parametrize(("name", "tool"), [("tools", "TRIANGLE_AREA"), ("tools_stream", "GET_WEATHER")])
def test_an_openai_client_gets_a_valid_call_whole_and_streamed(url: str, name: str, tool: str) -> None:
    check_calls(calls(run(name, url)), [constant(name, tool)])


def test_required_and_named_tool_choice_each_get_a_valid_call(url: str) -> None:
    printed = calls(run("tool_choice", url))
    check_calls(printed, example("tool_choice").TOOLS)
    assert [c["tool_choice"] for c in printed] == [
        "required",
        {"type": "function", "function": {"name": "get_time"}},
    ]
    assert printed[1]["name"] == "get_time"


def test_langchain_gets_a_valid_call_and_runs_the_tool(url: str) -> None:
    printed = calls(run("langchain_tools", url))
    tool = example("langchain_tools").calculate_triangle_area
    for call in printed:
        assert call["name"] == tool.name
        assert float(call["result"]) == tool.invoke(call["arguments"])
    check_calls(
        printed, [{"function": {"name": tool.name, "parameters": tool.tool_call_schema.model_json_schema()}}]
    )


@pytest.mark.parametrize("name", ["typed_answer", "agents_sdk", "pydantic_ai_agent"])
def test_an_agent_calls_its_tool_then_prints_its_typed_answer(url: str, name: str) -> None:
    """The tools and the answer's schema in every request, the clients' defaults otherwise: the
    model must answer after the tool's result, not call again until the loop's bound."""
    lines = run(name, url)
    assert any(line.startswith("called calculate_triangle_area(") for line in lines[:-1]), lines
    example(name).Area.model_validate_json(lines[-1])
