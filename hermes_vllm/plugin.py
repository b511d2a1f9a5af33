"""The ``vllm.general_plugins`` entry point: runs in every vLLM process, possibly several times."""

from __future__ import annotations

from hermes_vllm import metrics
from hermes_vllm.parsers import finish_reason, register_parsers
from hermes_vllm.processor import exposition, handshake, speculative
from hermes_vllm.vllm_api import check_release


def register() -> None:
    """Idempotent: warn once where this vLLM is newer than every release checked
    (:mod:`hermes_vllm.vllm_api.release`), prepare the processor handshake, register the tool
    and reasoning parsers, wrap vLLM's structured outputs for speculative decoding, and the
    offline engine's outputs (:func:`hermes_vllm.parsers.finish_reason.install_offline`), and
    put our series on vLLM's ``/metrics`` and offline ``get_metrics()`` (:mod:`hermes_vllm.metrics`,
    :mod:`hermes_vllm.processor.exposition`).

    See :mod:`hermes_vllm.processor.handshake`, :mod:`hermes_vllm.parsers` and
    :mod:`hermes_vllm.processor.speculative`.
    """
    check_release()
    handshake.ensure_dir()
    register_parsers()
    speculative.install()
    finish_reason.install_offline()  # vllm.LLM: a call the budget closed finishes with "length"
    metrics.install()  # our series on /metrics, from every process (hermes_vllm.metrics)
    exposition.install()  # ... and in offline LLM.get_metrics()
