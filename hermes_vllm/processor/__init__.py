"""The vLLM logits processor: a batch core plus thin adapters for the V1 runner and Model Runner V2.

``ToolCallLogitsProcessor`` is the class registered under the ``vllm.logits_processors`` entry
point; it serves both runners (see :mod:`hermes_vllm.processor.v2`).
"""

from hermes_vllm.processor.v2 import ToolCallLogitsProcessor

__all__ = ["ToolCallLogitsProcessor"]
