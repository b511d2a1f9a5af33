"""One install activates the processor on both runners, and a request is never served unconstrained.

vLLM's own loaders are called: the V2 loader type-checks entry points (a V1-only class would crash
V2 launches), the V1 loader builds classes with the V1 signature. When no processor of ours is
active in the engine, a constrained request is refused with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hermes_vllm import constraint_args

pytest.importorskip("vllm")

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def test_vllm_v2_loader_accepts_the_entry_point() -> None:
    from vllm.v1.worker.gpu.sample.logits_processor import loader

    from hermes_vllm.processor import ToolCallLogitsProcessor

    classes = loader._load_v2_logitsprocs_plugins()
    assert ToolCallLogitsProcessor in classes
    validate = loader.build_custom_logits_processors_params_validator(None)
    from vllm import SamplingParams

    validate(SamplingParams())  # requests without constraints pass untouched


def test_vllm_v1_loader_builds_the_v1_adapter(tiny_model: Path) -> None:
    pytest.importorskip(
        "vllm.v1.sample.logits_processor", reason="this vLLM has no V1 runner (0.34 deleted it)"
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.sample.logits_processor import build_logitsprocs

    from hermes_vllm.processor.v1 import V1ToolCallLogitsProcessor

    config = EngineArgs(model=str(tiny_model), dtype="float32", max_model_len=512).create_engine_config()
    procs = build_logitsprocs(config, __import__("torch").device("cpu"), False, False)
    ours = [p for p in procs.all if isinstance(p, V1ToolCallLogitsProcessor)]
    assert len(ours) == 1 and ours[0] in procs.non_argmax_invariant


def test_frontend_rejects_malformed_constraints_with_readable_errors() -> None:
    from vllm import SamplingParams

    from hermes_vllm.processor import ToolCallLogitsProcessor

    bad_schema = {
        "type": "function",
        "function": {"name": "t", "parameters": {"type": "object", "properties": {"x": {"type": "strnig"}}}},
    }
    cases: list[tuple[dict[str, Any], str]] = [
        ({"hermes_vllm": "{not json"}, "not valid JSON"),
        (constraint_args([bad_schema]), "tool 't': parameters/properties/x/type"),
        (constraint_args([TOOL], dialect="klingon"), "unknown dialect 'klingon'"),
        (constraint_args([TOOL], {"type": "function", "function": {"name": "nope"}}), "nope"),
        (constraint_args([TOOL, TOOL]), "defined more than once"),
    ]
    for extra, needle in cases:
        with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
            ToolCallLogitsProcessor.validate_params(SamplingParams(extra_args=extra))


def run_fresh(script: str) -> dict[str, Any]:
    """Run ``script`` in a new process (no handshake notes from this one); its last line is JSON."""
    env = {k: v for k, v in os.environ.items() if k != "HERMES_VLLM_HANDSHAKE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


SPECULATIVE = """
import json
from hermes_vllm import constraint_args
from support.offline import offline_llm
from vllm import SamplingParams
from vllm.v1.structured_output import StructuredOutputManager
# A vLLM without the method the speculative path wraps (requests without a grammar never call it).
del StructuredOutputManager._create_grammar
llm = offline_llm({model!r}, speculative_config={{"method": "ngram", "num_speculative_tokens": 2,
                                                 "prompt_lookup_max": 3, "prompt_lookup_min": 2}})
plain = llm.generate(["hello"], SamplingParams(max_tokens=4), use_tqdm=False)[0].outputs[0].text
try:
    llm.generate(["hello"], SamplingParams(max_tokens=4, extra_args=constraint_args({tools!r})), use_tqdm=False)
    print(json.dumps({{"plain": plain, "error": None}}))
except Exception as err:
    print(json.dumps({{"plain": plain, "error": str(err)}}))
"""


@pytest.mark.engine
def test_a_runner_without_our_processor_refuses_constrained_requests(tiny_model: Path) -> None:
    """V1 with speculative decoding skips entry-point processors; where vLLM also lacks what the
    speculative path wraps (:mod:`hermes_vllm.processor.speculative`), constrained requests fail
    and say what is missing."""
    result = run_fresh(SPECULATIVE.format(model=str(tiny_model), tools=[TOOL]))
    assert result["plain"], "requests without constraints must still be served"
    assert result["error"] and "no hermes-vllm logits processor is active" in result["error"]
    assert "has no vllm.v1.structured_output.StructuredOutputManager._create_grammar" in result["error"]


V2_SPECULATIVE = """
import json, os, torch
from hermes_vllm.testing.engine import triton_assumed
with triton_assumed():  # CPU buffers for the V2 runner's state, as vLLM's CPU worker makes them
    import vllm.v1.worker.cpu.shm
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.worker.gpu.states import RequestState
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcRequestState
from hermes_vllm import constraint_args
from hermes_vllm.plugin import register
from hermes_vllm.processor import ToolCallLogitsProcessor
register()
with triton_assumed():
    config = EngineArgs(model={model!r}, dtype="float32", max_model_len=512, speculative_config={{
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2}}).create_engine_config()
states = RequestState(4, 512, 256, 2, config.model_config.get_vocab_size(), torch.device("cpu"))
proc = ToolCallLogitsProcessor(config, LogitsProcRequestState.from_request_state(states))
added = proc.add_request(0, SamplingParams(extra_args=constraint_args({tools!r})))
try:
    ToolCallLogitsProcessor.validate_params(SamplingParams(extra_args=constraint_args({tools!r})))
    error = None
except ValueError as err:
    error = str(err)
print(json.dumps({{"added": added, "error": error}}))
"""


def test_model_runner_v2_with_speculative_decoding_refuses_constrained_requests(tiny_model: Path) -> None:
    """V2 builds our processor even with speculative decoding; it declines and says why."""
    result = run_fresh(V2_SPECULATIVE.format(model=str(tiny_model), tools=[TOOL]))
    assert result["added"] is False
    assert result["error"] and "speculative decoding" in result["error"]


def test_notes_of_stopped_engines_and_of_ancestors_are_not_this_frontends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that ran an offline engine (its note: its own pid) and then started a server,
    or a server that has stopped, leaves notes in the directory its children inherit: under
    ``pytest -n 2`` a Qwen 3 server read a stopped Llama 3.1 engine's special tags and refused
    every constrained request. Only live non-ancestor processes (and this one) count."""
    from hermes_vllm.processor import handshake

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    monkeypatch.setenv(handshake.ENV, str(tmp_path))
    for pid, tags in ((os.getppid(), ["<tool_call>"]), (dead.pid, ["<think>"]), (os.getpid(), ["</think>"])):
        note = {"runner": "v1", "pid": pid, "error": None, "special_tags": tags}
        (tmp_path / f"v1-{pid}.json").write_text(json.dumps(note))
    assert handshake.announced_special_tags() == {"</think>"}
