"""Finding what a patch of vLLM wraps, for the few places where vLLM offers no hook.

vLLM-free at import (the general plugin imports the patches in every process); each patch looks
its target up by name and is left out, with a warning, where this vLLM has no such target.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def vllm_attribute(module: str, owner: str, name: str, skipped: str) -> tuple[Any, Any] | None:
    """``(class, attribute)``: ``owner.name`` of a vLLM module; ``None`` where this vLLM has none,
    with ``skipped`` (``%s`` for the module and what is missing) logged: never fatal."""
    try:
        cls = getattr(__import__(module, fromlist=[owner]), owner)
        return cls, getattr(cls, name)
    except (ImportError, AttributeError):
        logger.warning(skipped, module, f"no {owner}.{name}")
        return None
