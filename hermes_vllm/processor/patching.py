"""Finding what a patch of vLLM wraps, for the few places where vLLM offers no hook.

vLLM-free at import (the general plugin imports the patches in every process); each patch looks
its target up by name and is left out, with a warning, where this vLLM has no such target.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
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


def wrap_attribute(
    module: str,
    owner: str,
    name: str,
    skipped: str,
    wrap: Callable[[Any], Any],
    marker: str,
    *,
    static: bool = False,
) -> bool:
    """Replace ``owner.name`` of a vLLM module with ``wrap(it)`` once per process (the wrapper
    carries ``marker``; ``static``: set it back as a staticmethod). False where it is not there."""
    found = vllm_attribute(module, owner, name, skipped)
    if found is None:
        return False
    cls, attribute = found
    if not getattr(attribute, marker, False):
        wrapped = wrap(attribute)
        setattr(wrapped, marker, True)
        setattr(cls, name, staticmethod(wrapped) if static else wrapped)
    return True
