"""How the frontend learns that a hermes-vllm processor is really active in the engine.

A request that asks for constraints must never be served unconstrained: on a runner that does
not load our processor (speculative decoding on the V1 runner, a platform without custom logits
processors, ...) the frontend refuses it instead. The general plugin, loaded in the frontend
before the engine processes are started, picks a directory and exports it in the environment;
each processor instance writes a note there when it is built; ``validate_params`` (frontend)
reads the notes.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

ENV = "HERMES_VLLM_HANDSHAKE_DIR"


def ensure_dir() -> Path:
    """The handshake directory of this process tree, created (and exported) on first call."""
    path = os.environ.get(ENV)
    if not path or not Path(path).is_dir():
        path = tempfile.mkdtemp(prefix="hermes-vllm-handshake-")
        os.environ[ENV] = path
    return Path(path)


def announce(runner: str, error: str | None = None) -> None:
    """Record that a processor was built in this process (or why it cannot constrain)."""
    note = {"runner": runner, "pid": os.getpid(), "error": error}
    (ensure_dir() / f"{runner}-{os.getpid()}.json").write_text(json.dumps(note), encoding="utf-8")


def status() -> tuple[bool, str]:
    """(active, detail): whether some processor announced itself without an error."""
    path = os.environ.get(ENV)
    notes = []
    if path and Path(path).is_dir():
        for f in sorted(Path(path).glob("*.json")):
            try:
                notes.append(json.loads(f.read_text(encoding="utf-8")))
            except (OSError, json.JSONDecodeError):
                continue
    errors = [n["error"] for n in notes if n.get("error")]
    if any(not n.get("error") for n in notes):
        return True, ""
    if errors:
        return False, errors[0]
    return False, (
        "no hermes-vllm logits processor is active in this engine (speculative decoding on the V1 "
        "runner, a pooling model, or a platform without custom logits processors)"
    )
