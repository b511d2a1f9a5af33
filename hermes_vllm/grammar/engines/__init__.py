"""Grammar engine backends behind one interface.

``xgrammar`` is the default of :class:`~hermes_vllm.grammar.ToolGrammarCompiler`; the server uses
``auto`` (xgrammar, and llguidance for the turns xgrammar compiles slowly or cannot enforce).

Optional engines import their library lazily, so a missing extra fails only when selected.
"""

from __future__ import annotations

import importlib

from hermes_vllm.grammar.engines.base import GrammarEngine

ENGINES: dict[str, str] = {
    "auto": "hermes_vllm.grammar.engines.auto:AutoEngine",
    "xgrammar": "hermes_vllm.grammar.engines.xgrammar:XGrammarEngine",
    "llguidance": "hermes_vllm.grammar.engines.llguidance:LLGuidanceEngine",
    "outlines": "hermes_vllm.grammar.engines.outlines:OutlinesEngine",
}


def get_engine_class(name: str) -> type[GrammarEngine]:
    """The engine class registered as ``name``; a clear error for unknown names or missing extras."""
    if name not in ENGINES:
        raise ValueError(f"unknown grammar engine {name!r}; choose one of {', '.join(ENGINES)}")
    module, cls = ENGINES[name].split(":")
    try:
        loaded = getattr(importlib.import_module(module), cls)
    except ImportError as err:
        raise ValueError(
            f"grammar engine {name!r} needs an extra: pip install 'hermes-vllm[{name}]' ({err})"
        ) from None
    if not (isinstance(loaded, type) and issubclass(loaded, GrammarEngine)):
        raise TypeError(f"{ENGINES[name]} is not a GrammarEngine")
    return loaded
