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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ENV = "HERMES_VLLM_HANDSHAKE_DIR"


def ensure_dir() -> Path:
    """The handshake directory of this process tree, created (and exported) on first call."""
    path = os.environ.get(ENV)
    if not path or not Path(path).is_dir():
        path = tempfile.mkdtemp(prefix="hermes-vllm-handshake-")
        os.environ[ENV] = path
    return Path(path)


def announce(runner: str, error: str | None = None, special_tags: Iterable[str] = ()) -> None:
    """Record that a processor was built in this process (or why it cannot constrain), and which
    dialect tags the engine's tokenizer has as special tokens (the frontend cannot load it)."""
    note = {"runner": runner, "pid": os.getpid(), "error": error, "special_tags": sorted(special_tags)}
    target = ensure_dir() / f"{runner}-{os.getpid()}.json"
    staging = target.with_suffix(".tmp")
    staging.write_text(json.dumps(note), encoding="utf-8")
    os.replace(staging, target)  # a rename: the directory's mtime tells readers a note changed


def _ancestors() -> frozenset[int]:
    """The pids above this process (psutil comes with vLLM; without it, the parent only)."""
    try:
        import psutil
    except ImportError:
        return frozenset({os.getppid()})
    return frozenset(p.pid for p in psutil.Process().parents())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _notes() -> list[dict[str, Any]]:
    """The notes of live processes that can be this frontend's engines.

    The directory is inherited by everything started below the process that created it, so it
    can also hold notes no engine of ours wrote: a process that ran an offline engine and then
    started a server (a test session, a notebook), or a server that has since stopped. Under
    ``pytest -n 2`` a Qwen 3 server read a stopped Llama 3.1 server's note and refused every
    constrained request for tags that were special only there. An engine is never an ancestor
    of its frontend, and a dead one serves nothing.
    """
    path = os.environ.get(ENV)
    notes = []
    if path and Path(path).is_dir():
        above = _ancestors()
        for f in sorted(Path(path).glob("*.json")):
            try:
                note = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            pid = note.get("pid")
            if isinstance(pid, int) and (pid in above or not _alive(pid)):
                continue
            notes.append(note)
    return notes


_seen: tuple[tuple[str, int], frozenset[str], frozenset[str]] | None = None
"""(directory key, special tags, runners) of the active notes."""


def _active() -> tuple[frozenset[str], frozenset[str]]:
    """(special tags, runners) of the processors that announced themselves without an error.

    Read on every constrained request, so it is cached until a processor announces itself again
    (one ``stat`` per call): an engine built later in the same process replaces the earlier note.
    """
    global _seen
    path = os.environ.get(ENV)
    try:
        key = (path or "", os.stat(path).st_mtime_ns if path else 0)
    except OSError:
        key = (path or "", 0)
    if _seen is None or _seen[0] != key:
        active = [n for n in _notes() if not n.get("error")]
        tags = frozenset(t for n in active for t in n.get("special_tags", ()))
        _seen = (key, tags, frozenset(str(n.get("runner")) for n in active))
    return _seen[1], _seen[2]


def announced_special_tags() -> frozenset[str]:
    """The dialect tags the active processors' tokenizer has as special tokens."""
    return _active()[0]


def runner_active(runner: str) -> bool:
    """Whether ``runner`` announced itself without an error (e.g. ``"speculative"``)."""
    return runner in _active()[1]


def status() -> tuple[bool, str]:
    """(active, detail): whether some processor announced itself without an error."""
    notes = _notes()
    errors = [n["error"] for n in notes if n.get("error")]
    if any(not n.get("error") for n in notes):
        return True, ""
    if errors:
        return False, errors[0]
    return False, (
        "no hermes-vllm logits processor is active in this engine (speculative decoding on the V1 "
        "runner, a pooling model, or a platform without custom logits processors)"
    )
