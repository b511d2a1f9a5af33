"""The test server helper reports a server that cannot start, with its log, instead of hanging."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, ServerError, free_port, openai_server


@pytest.mark.server
def test_a_server_that_cannot_start_is_an_error_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with (
        pytest.raises(ServerError, match=r"exited with code [1-9]") as failed,
        openai_server(tmp_path / "no-such-model", CPU_ARGS, CPU_ENV, startup_timeout=240, log_path=log),
    ):
        pytest.fail("the server must not come up")
    assert str(tmp_path / "no-such-model") in str(failed.value)
    assert log.stat().st_size > 0


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_server_does_not_outlive_a_caller_killed_by_sigkill(tmp_path: Path) -> None:
    """A test run killed by a signal, SIGKILL above all, left its servers running (each in a
    session of its own, so no signal to the run's group reached them): a spawned process now
    ends with the process that started it."""
    caller = subprocess.Popen(
        [
            sys.executable, "-c",
            "import sys, time\n"
            "from hermes_vllm.demo.server import spawn\n"
            "child = spawn([sys.executable, '-c', 'import time; time.sleep(120)'], {}, sys.stderr.buffer)\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert caller.stdout is not None
    child = int(caller.stdout.readline())
    time.sleep(0.5)  # the child has asked for its signal and exec'd
    assert _running(child)
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 10
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _running(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the spawned process outlived its caller")
