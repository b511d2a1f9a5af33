"""The test server helper reports a server that cannot start, with its log, instead of hanging."""

from __future__ import annotations

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
