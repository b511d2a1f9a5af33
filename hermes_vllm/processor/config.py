"""Build a :class:`ConstraintCore` from vLLM's engine config, and announce it to the frontend."""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import TYPE_CHECKING, Any

from hermes_vllm.constraint import special_tags
from hermes_vllm.dialect import available_dialects
from hermes_vllm.grammar.budget import register_speller
from hermes_vllm.processor import handshake, remote
from hermes_vllm.processor.core import ConstraintCore

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
            "speculative decoding is enabled, and hermes-vllm cannot constrain draft tokens; "
            "serve tool calls without --speculative-config"
        )
    remote.expose()
    if reason is not None:
        handshake.announce(runner, reason)
        logger.warning("hermes-vllm: %s", reason)
        return None
    model_config = vllm_config.model_config
    core = ConstraintCore(
        partial(_load_tokenizer, vllm_config),
        model_config.get_vocab_size(),
        engine_name(),
        device.type == "cuda",
    )
    register_speller(lambda: core.speller)  # offline, the frontend check runs in this process
    tokenizer = _load_tokenizer(vllm_config)  # vLLM caches it: the core's later load is free
    tags = special_tags(tokenizer, *available_dialects()) if tokenizer is not None else frozenset()
    handshake.announce(runner, special_tags=tags)
    logger.info("hermes-vllm tool-call constraints active (%s runner, %s engine)", runner, core.engine)
    return core
