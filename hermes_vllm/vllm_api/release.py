"""Which vLLM release runs, and one warning where it is newer than every release checked.

Teams install vLLM themselves and add the plugin with ``pip install``, so the plugin meets
releases it was never checked against. A newer one is served (its touch points may well hold),
but the log says once, naming what was not checked on it, so that a silent change (as 0.34's
hook order was) is looked for first.
"""

from __future__ import annotations

import logging
from functools import cache

from hermes_vllm.vllm_api.touchpoints import RELEASES, TOUCH_POINTS

logger = logging.getLogger(__name__)


def release_of(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``0.34.0`` or ``0.35.0rc1+cu130``."""
    parts = [int("".join(ch for ch in part if ch.isdigit()) or 0) for part in version.split(".")[:2]]
    return parts[0], parts[1] if len(parts) > 1 else 0


NEWEST = max(release_of(release) for release in RELEASES)


def unchecked(version: str) -> str | None:
    """The warning for ``version``; ``None`` where it is not newer than the newest checked."""
    if release_of(version) <= NEWEST:
        return None
    kinds: dict[str, list[str]] = {}
    for point in TOUCH_POINTS:
        if RELEASES[-1] in point.releases:
            kinds.setdefault(point.kind, []).append(point.target.replace(":", "."))
    listed = "; ".join(f"{kind}: {', '.join(targets)}" for kind, targets in kinds.items())
    return (
        f"hermes-vllm was checked against vLLM {', '.join(RELEASES)}; vLLM {version} is newer, so none of "
        f"what it relies on was checked there ({listed}). Constrained requests are still served; "
        f"please report what breaks."
    )


@cache
def check_release() -> None:
    """Warn once per process where the running vLLM is newer than every release checked."""
    import vllm

    warning = unchecked(str(vllm.__version__))
    if warning is not None:
        logger.warning(warning)
