"""Finding what a wrap of vLLM replaces, for the few places where vLLM offers no hook.

vLLM-free at import (the general plugin imports the wraps in every process); each wrap names its
target by a :class:`~hermes_vllm.vllm_api.touchpoints.TouchPoint` and is left out, with a warning,
where this vLLM has no such target.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from hermes_vllm.vllm_api.touchpoints import TouchPoint

logger = logging.getLogger(__name__)


def vllm_attribute(point: TouchPoint, skipped: str) -> tuple[Any, Any] | None:
    """``(owner, attribute)``: ``point``'s last attribute and what holds it; ``None`` where this
    vLLM has none, with ``skipped`` (``%s`` for the module and what is missing) logged: never fatal."""
    *owners, name = point.path
    try:
        owner: Any = importlib.import_module(point.module)
        for part in owners:
            owner = getattr(owner, part)
        return owner, getattr(owner, name)
    except (ImportError, AttributeError):
        logger.warning(skipped, point.module, f"no {'.'.join(point.path)}")
        return None


def wrap_attribute(
    point: TouchPoint, skipped: str, wrap: Callable[[Any], Any], marker: str, *, static: bool = False
) -> bool:
    """Replace ``point``'s attribute with ``wrap(it)`` once per process (the wrapper carries
    ``marker``; ``static``: set it back as a staticmethod). False where it is not there."""
    found = vllm_attribute(point, skipped)
    if found is None:
        return False
    owner, attribute = found
    if not getattr(attribute, marker, False):
        wrapped = wrap(attribute)
        setattr(wrapped, marker, True)
        setattr(owner, point.path[-1], staticmethod(wrapped) if static else wrapped)
    return True
