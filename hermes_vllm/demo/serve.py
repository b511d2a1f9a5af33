"""``make serve``: the model trained here behind hermes-vllm's parsers, on a fixed local port.

The demo compares servers and stops them; this keeps one running so that any OpenAI-compatible
client (the scripts in ``examples/``, an agent framework, ``curl``) can be pointed at it. It
prints the base URL and the served model name once the server answers, then stays until stopped
(Ctrl-C, SIGTERM), and exits non-zero if the server stops answering.

The model is small and weak (:mod:`hermes_vllm.demo.trained_model`), so the server samples
greedily and caps a reply at :data:`DEFAULT_MAX_TOKENS` unless a request says otherwise: clients
keep their own defaults and still get the same reply every run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_PORT = 8000
SERVED_NAME = "hermes-vllm-demo"
"""The model name clients send (``--served-model-name``), instead of the cache path."""
DEFAULT_MAX_TOKENS = 256
PARSERS = {"qwen": "hermes_vllm_qwen", "chatml-brackets": "hermes_vllm_brackets"}
"""The parser of each dialect the model was trained on: Qwen 3's own template (``<tool_call>``, the
default) and, through our template, the bracket dialect (``[tool_call]``)."""
CHECK_EVERY_S = 2.0


def server_flags(dialect: str, template_dir: Path) -> list[str]:
    """The parser flags for ``dialect`` (and our chat template where the model's own is not it)."""
    parser = PARSERS[dialect]
    flags = ["--served-model-name", SERVED_NAME, "--enable-auto-tool-choice"]
    flags += ["--tool-call-parser", parser, "--reasoning-parser", parser]
    generation = {"temperature": 0.0, "max_new_tokens": DEFAULT_MAX_TOKENS}
    flags += ["--override-generation-config", json.dumps(generation)]
    if dialect != "qwen":
        from hermes_vllm.formats.chat_template import chat_template

        template = template_dir / f"{dialect}.jinja"
        template.write_text(chat_template(dialect), encoding="utf-8")
        flags += ["--chat-template", str(template)]
    return flags


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def serve(port: int, dialect: str) -> int:
    """Serve until stopped; 1 when the server stops answering."""
    import torch

    from hermes_vllm.demo.server import CPU_ARGS, CPU_ENV, openai_server
    from hermes_vllm.demo.trained_model import trained_model_path

    model = trained_model_path()
    on_cpu = not torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="hermes-vllm-serve-") as folder:
        log = Path(folder) / "server.log"
        flags = [*server_flags(dialect, Path(folder)), *(CPU_ARGS if on_cpu else ())]
        print(f"starting vLLM on {model} (log {log}) ...", flush=True)
        with openai_server(model, flags, CPU_ENV if on_cpu else None, port=port, log_path=log) as url:
            print(f"serving model {SERVED_NAME!r} ({dialect} dialect) at {url}", flush=True)
            print(f"  export OPENAI_BASE_URL={url} OPENAI_MODEL={SERVED_NAME}", flush=True)
            health = url.removesuffix("/v1") + "/health"
            while _answers(health):
                time.sleep(CHECK_EVERY_S)
            print(f"the server stopped answering; its log: {log}", file=sys.stderr, flush=True)
            print(log.read_text(encoding="utf-8", errors="replace")[-4000:], file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hermes_vllm.demo.serve", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"(default {DEFAULT_PORT})")
    parser.add_argument(
        "--dialect", choices=sorted(PARSERS), default="qwen", help="the tool-call dialect (default qwen)"
    )
    args = parser.parse_args(argv)
    try:
        return serve(args.port, args.dialect)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
