"""The vLLM logits processor: a batch core plus thin adapters for the V1 runner and Model Runner V2.

``ToolCallLogitsProcessor`` is the class registered under the ``vllm.logits_processors`` entry
point; it serves both runners (see :mod:`hermes_vllm.processor.v2`). It is imported when first
asked for, so that importing a module of this package (the API server's tool parser importing
``remote``) loads no adapter, nor the parts of vLLM an adapter needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hermes_vllm.processor.v2 import ToolCallLogitsProcessor

__all__ = ["ToolCallLogitsProcessor"]


def __getattr__(name: str) -> Any:
    if name == "ToolCallLogitsProcessor":
        from hermes_vllm.processor.v2 import ToolCallLogitsProcessor

        return ToolCallLogitsProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
