"""Tool definitions -> one normalised JSON Schema per tool, within the limits.

Accepts OpenAI tool definitions (``{"type": "function", "function": {...}}``), bare function
definitions and the Berkeley Function Calling Leaderboard dialect (``dict``, ``float``, ``tuple``,
``any``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from hermes_vllm.memo import memoize_small
from hermes_vllm.schema.metaschema import passes_metaschema
from hermes_vllm.schema.rewrite import KEY_ORDERS, any_argument_order, make_explicit, object_root
from hermes_vllm.schema.satisfiable import UnsatisfiableToolError, contradiction
from hermes_vllm.schema.spec import JSON, ToolSchemaError, ToolSpec, pointer
from hermes_vllm.schema.tree import depth, iter_subschemas, resolve_ref
from hermes_vllm.settings import Limits, get_limits

logger = logging.getLogger(__name__)


_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}


def bfcl_to_json_schema(schema: JSON) -> JSON:
    """Rewrite BFCL type names (``dict``, ``float``, ``tuple``, ``any``) to JSON Schema, in place."""
    for _, sub in list(iter_subschemas(schema)):
        kind = sub.get("type")
        if kind == "any":
            del sub["type"]
        elif isinstance(kind, str) and kind in _BFCL_TYPES:
            sub["type"] = _BFCL_TYPES[kind]
        elif isinstance(kind, list):
            sub["type"] = [_BFCL_TYPES.get(k, k) for k in kind if k != "any"] or None
            if sub["type"] is None:
                del sub["type"]
    return schema


def _check_refs(tool: str, schema: JSON) -> None:
    """Every ``$ref`` must be a local JSON pointer (or ``#``) that resolves inside the tool."""
    for path, sub in iter_subschemas(schema):
        ref = sub.get("$ref")
        if ref is None:
            continue
        where = pointer(("parameters", *path, "$ref"))
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise ToolSchemaError(tool, where, f"only local references ('#/...') are supported, got {ref!r}")
        try:
            resolve_ref(schema, ref)
        except LookupError:
            raise ToolSchemaError(
                tool, where, f"reference {ref!r} does not resolve inside the tool's schema"
            ) from None


def _check_bounds(tool: str, schema: JSON, limits: Limits) -> None:
    for path, sub in iter_subschemas(schema):
        for key in ("minLength", "maxLength"):
            bound = sub.get(key)
            if isinstance(bound, int) and bound > limits.max_string_length_bound:
                raise ToolSchemaError(
                    tool,
                    pointer(("parameters", *path, key)),
                    f"{bound} exceeds the limit of {limits.max_string_length_bound} "
                    "(HERMES_VLLM_MAX_STRING_LENGTH_BOUND)",
                )
        enum = sub.get("enum")
        if isinstance(enum, list) and len(enum) > limits.max_enum_values:
            raise ToolSchemaError(
                tool,
                pointer(("parameters", *path, "enum")),
                f"{len(enum)} values exceed the limit of {limits.max_enum_values} "
                "(HERMES_VLLM_MAX_ENUM_VALUES)",
            )


def _function_of(raw: JSON, index: int) -> Mapping[str, JSON]:
    if hasattr(raw, "model_dump"):
        raw = raw.model_dump(exclude_none=True)
    if not isinstance(raw, Mapping):
        raise ToolSchemaError(None, f"tools[{index}]", f"expected an object, got {type(raw).__name__}")
    if "function" in raw:
        if raw.get("type", "function") != "function":
            raise ToolSchemaError(
                None, f"tools[{index}].type", f"only 'function' tools are supported, got {raw.get('type')!r}"
            )
        fn = raw["function"]
        if not isinstance(fn, Mapping):
            raise ToolSchemaError(None, f"tools[{index}].function", "expected an object")
        return fn
    return raw


@memoize_small(len)
def _metaschema_problem(params_json: str) -> tuple[str, str] | None:
    """(path, message) of the first metaschema violation, memoised: the check costs milliseconds.

    The screen (:mod:`.metaschema`) passes the schemas tools send in microseconds; jsonschema's
    own check runs where it does not, and words the error."""
    schema = json.loads(params_json)
    if passes_metaschema(schema):
        return None
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as err:
        return pointer(("parameters", *err.absolute_path)), err.message
    return None


def normalize_tool(
    raw: JSON, index: int = 0, limits: Limits | None = None, *, check_metaschema: bool = True
) -> ToolSpec:
    """One tool definition (OpenAI, bare or BFCL) -> :class:`ToolSpec`, or a :class:`ToolSchemaError`.

    ``check_metaschema=False`` skips the JSON Schema metaschema check, for callers that know the
    frontend already made it (the engine re-normalising a request vLLM admitted).
    """
    limits = limits or get_limits()
    fn = _function_of(raw, index)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ToolSchemaError(None, f"tools[{index}].function.name", "a non-empty string is required")
    if len(name) > limits.max_name_length:
        raise ToolSchemaError(
            name[:40] + "...", "name", f"{len(name)} characters exceed the limit of {limits.max_name_length}"
        )
    if any(ord(c) < 32 for c in name):
        raise ToolSchemaError(name, "name", "control characters are not allowed in a tool name")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object"}
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except json.JSONDecodeError as err:
            raise ToolSchemaError(name, "parameters", f"not valid JSON: {err}") from None
    if params is True:
        params = {"type": "object"}
    if not isinstance(params, dict):
        raise ToolSchemaError(
            name, "parameters", f"expected a JSON Schema object, got {type(params).__name__}"
        )
    params = bfcl_to_json_schema(copy.deepcopy(params))
    if depth(params, limits.max_schema_depth) > 2 * limits.max_schema_depth:
        raise ToolSchemaError(
            name,
            "parameters",
            f"nesting deeper than {limits.max_schema_depth} levels (HERMES_VLLM_MAX_SCHEMA_DEPTH)",
        )
    if check_metaschema:
        problem = _metaschema_problem(canonical_json(params))
        if problem is not None:
            raise ToolSchemaError(name, problem[0], f"not a valid JSON Schema: {problem[1]}")
    kind = params.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise ToolSchemaError(
            name, "parameters.type", f"the arguments of a call are a JSON object, got type {kind!r}"
        )
    object_root(params)
    _check_refs(name, params)
    _check_bounds(name, params, limits)
    found = contradiction(params)
    if found is not None:
        raise UnsatisfiableToolError(
            name, pointer(("parameters", *found.path)), f"{found.reason}: no call can satisfy this schema"
        )
    make_explicit(name, params, limits.max_schema_depth)
    if limits.call_key_order not in KEY_ORDERS:
        raise ValueError(f"HERMES_VLLM_CALL_KEY_ORDER: expected one of {', '.join(KEY_ORDERS)}")
    if limits.call_key_order == "any":
        any_argument_order(params)
    _check_refs(name, params)
    description = fn.get("description")
    return ToolSpec(
        name=name, parameters=params, description=description if isinstance(description, str) else ""
    )


def normalize_tools(
    tools: Sequence[JSON] | None, limits: Limits | None = None, *, check_metaschema: bool = True
) -> tuple[ToolSpec, ...]:
    """A request's tool list -> specs; any error, a tool no call can satisfy included, is raised."""
    specs, unusable = read_tools(tools, limits, check_metaschema=check_metaschema)
    if unusable:
        raise unusable[0]
    return specs


@memoize_small(lambda text, limits, check_metaschema: len(text))
def _normalized(text: str, limits: Limits, check_metaschema: bool) -> ToolSpec:
    """:func:`normalize_tool` of one tool's JSON text, memoised: agents resend their tools, and a
    set one tool away from a known one then normalises its new tool only (normalising every tool
    was most of a one-tool change once the grammar is composed: docs/architecture.md,
    "Measurements behind the code")."""
    return normalize_tool(json.loads(text), 0, limits, check_metaschema=check_metaschema)


def _normalize_memoised(raw: JSON, index: int, limits: Limits, check_metaschema: bool) -> ToolSpec:
    """:func:`_normalized` where ``raw`` is JSON; an error is raised again by :func:`normalize_tool`
    itself, so its message names the tool's index."""
    try:
        text = json.dumps(raw, ensure_ascii=False, separators=(",", ":"))
        return _normalized(text, limits, check_metaschema)
    except UnsatisfiableToolError:
        raise  # names the tool and the path, never the index
    except (ToolSchemaError, TypeError, ValueError):
        return normalize_tool(raw, index, limits, check_metaschema=check_metaschema)


def read_tools(
    tools: Sequence[JSON] | None, limits: Limits | None = None, *, check_metaschema: bool = True
) -> tuple[tuple[ToolSpec, ...], tuple[UnsatisfiableToolError, ...]]:
    """A request's tool list -> (specs, the tools no call can satisfy), refusing everything else
    that is wrong: duplicates, lists beyond the limits, malformed or refused schemas.

    A tool no call can satisfy is left for the turn to drop (the request carries on for the
    others) and logged once per tool set (:func:`_log_unusable`), not once per request.
    """
    limits = limits or get_limits()
    if tools is None:
        return (), ()
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise ToolSchemaError(None, "", f"tools must be a list, got {type(tools).__name__}")
    if len(tools) > limits.max_tools:
        raise ToolSchemaError(
            None, "", f"{len(tools)} tools exceed the limit of {limits.max_tools} (HERMES_VLLM_MAX_TOOLS)"
        )
    # Measured as sent, before any work on it (normalising drops annotations such as descriptions).
    text = json.dumps(list(tools), ensure_ascii=False, separators=(",", ":"), default=repr)
    if len(text) > limits.max_schema_bytes:
        raise ToolSchemaError(
            None,
            "",
            f"{len(text)} bytes of schema exceed the limit of {limits.max_schema_bytes} "
            "(HERMES_VLLM_MAX_SCHEMA_BYTES)",
        )
    specs: list[ToolSpec] = []
    unusable: list[UnsatisfiableToolError] = []
    for i, raw in enumerate(tools):
        try:
            specs.append(_normalize_memoised(raw, i, limits, check_metaschema))
        except UnsatisfiableToolError as err:
            unusable.append(err)
    seen: set[str | None] = set()
    for name in [s.name for s in specs] + [u.tool for u in unusable]:
        if name in seen:
            raise ToolSchemaError(name, "name", "defined more than once; tool names must be unique")
        seen.add(name)
    if unusable:
        _log_unusable(hashlib.sha256(text.encode()).hexdigest(), "; ".join(map(str, unusable)))
    return tuple(specs), tuple(unusable)


@memoize_small(lambda tool_set, problems: len(tool_set))
def _log_unusable(tool_set: str, problems: str) -> None:
    """Log the left-out tools once per tool set (``tool_set`` is the digest of the list as sent):
    agents resend the same tools with every request, and one line per request would flood the log.
    Bounded like every request memo: a set evicted from it is logged again when it comes back."""
    logger.warning("left out of the grammar, since no call can satisfy them: %s", problems)


def canonical_json(value: JSON) -> str:
    """Compact, key-order-preserving JSON: the form cache keys and fingerprints are made of.

    Key order is kept, not sorted: declared property order is part of the grammar.
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
