"""The ``vllm.general_plugins`` entry point: runs in every vLLM process, possibly several times."""

from __future__ import annotations

from hermes_vllm.parsers import register_parsers
from hermes_vllm.processor import handshake


def register() -> None:
    """Idempotent: prepare the processor handshake and register the tool and reasoning parsers.

    See :mod:`hermes_vllm.processor.handshake` and :mod:`hermes_vllm.parsers`.
    """
    handshake.ensure_dir()
    register_parsers()
