"""Build a :class:`ConstraintCore` from vLLM's engine config, and announce it to the frontend."""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import TYPE_CHECKING, Any

from hermes_vllm.constraint import special_tags
from hermes_vllm.dialect import available_dialects
from hermes_vllm.processor import handshake, remote
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.processor.served import SERVED

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig

logger = logging.getLogger(__name__)

ENGINE_ENV = "HERMES_VLLM_ENGINE"


def engine_name() -> str:
    """The grammar engine this server uses: ``$HERMES_VLLM_ENGINE``, by default ``auto``."""
    return os.environ.get(ENGINE_ENV, "auto")


def _load_tokenizer(vllm_config: VllmConfig) -> Any:
    from vllm.tokenizers import cached_tokenizer_from_config

    return cached_tokenizer_from_config(vllm_config.model_config)


def core_for_config(
    vllm_config: VllmConfig, runner: str, device: torch.device, refusal: str | None = None
) -> ConstraintCore | None:
    """The core for this engine, or ``None`` where constraints cannot hold.

    ``refusal`` is the adapter's own reason they cannot. In the ``None`` case the frontend is
    told why, and refuses constrained requests with that reason (HTTP 400) while the server
    keeps serving everything else.
    """
    reason = refusal
    if vllm_config.speculative_config is not None:
        reason = (
            "speculative decoding is enabled: this processor would see unverified draft tokens, so "
            "constrained requests go through vLLM's structured outputs (hermes_vllm.processor.speculative)"
        )
    remote.expose()
    if reason is not None:
        handshake.announce(runner, reason)
        logger.warning("hermes-vllm: %s", reason)
        return None
    core = new_core(vllm_config, device.type == "cuda")
    announce_active(vllm_config, runner)
    logger.info("hermes-vllm tool-call constraints active (%s runner, %s engine)", runner, core.engine)
    return core


def new_core(vllm_config: VllmConfig, pin_memory: bool) -> ConstraintCore:
    """A core on the served model's tokenizer and vocabulary, with the server's grammar engine."""
    core = ConstraintCore(
        partial(_load_tokenizer, vllm_config),
        vllm_config.model_config.get_vocab_size(),
        engine_name(),
        pin_memory,
    )
    if not vllm_config.model_config.skip_tokenizer_init:  # no tokenizer: nothing can be constrained
        core.warm()  # at start-up, before vLLM freezes its heap: never on a first request's step
    # Offline the frontend's check runs in this process: it counts in this core's vocabulary.
    SERVED.serve_engine(lambda: core.speller)
    return core


def announce_active(vllm_config: VllmConfig, runner: str) -> None:
    """Tell the frontend that ``runner`` constrains requests, and which dialect tags the served
    tokenizer has as special tokens."""
    tokenizer = _load_tokenizer(vllm_config)  # vLLM caches it: the core's later load is free
    tags = special_tags(tokenizer, *available_dialects()) if tokenizer is not None else frozenset()
    handshake.announce(runner, special_tags=tags)
