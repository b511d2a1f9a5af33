"""The one room where hermes-vllm meets vLLM: every touch point, the releases it was checked on,
the release gate, and the lookups every wrap goes through.

:mod:`~hermes_vllm.vllm_api.touchpoints` lists each interface we subclass, hook vLLM calls, method
we wrap, attribute we set and function we call, by target, with the releases checked and what the
project does where a release lacks it; ``tests/test_vllm_api.py`` holds the catalog to the code
(every vLLM name the package uses is in it) and to each release (``make compat``).
:mod:`~hermes_vllm.vllm_api.release` warns once where a newer vLLM runs. The adapters that
implement vLLM's interfaces stay one module per concept (``processor/v1``, ``v2``, ``hosted``;
``parsers/``); what they touch is listed here. vLLM-free at import.
"""

from hermes_vllm.vllm_api.patching import vllm_attribute, wrap_attribute
from hermes_vllm.vllm_api.release import check_release
from hermes_vllm.vllm_api.touchpoints import RELEASES, TOUCH_POINTS, TouchPoint

__all__ = ["RELEASES", "TOUCH_POINTS", "TouchPoint", "check_release", "vllm_attribute", "wrap_attribute"]
