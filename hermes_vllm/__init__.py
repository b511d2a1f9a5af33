"""hermes-vllm: schema-guaranteed Hermes/ChatML tool calls for vLLM.

Data flow: tools -> :mod:`~hermes_vllm.schema` -> :mod:`~hermes_vllm.grammar` (compiled turn
grammar) -> per-request matcher -> :mod:`~hermes_vllm.processor` (one batch mask per step).
Importing this package does not import vLLM.
"""

from hermes_vllm.constraint import constraint_args, sampling_options
from hermes_vllm.dialect import Dialect, available_dialects, get_dialect

__all__ = ["Dialect", "available_dialects", "constraint_args", "get_dialect", "sampling_options"]
