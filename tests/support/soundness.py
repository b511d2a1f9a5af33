"""Soundness of compiled tool grammars, measured on the reference corpora.

A tool grammar is sound when it accepts every call a client may legitimately expect: each valid
instance of the JSON-Schema-Test-Suite, sent as the arguments of a one-tool call, and each on-schema
BFCL ground-truth call. Precision (rejecting invalid instances) is measured too, but a gap there
only means post-hoc validation matters; a soundness bug blocks a correct call outright.

Instances are checked through the real path (``ToolGrammarCompiler.compile`` in strict coverage,
then ``accepts_text``) under the documented argument policy: keys in the schema's declared order,
and no undeclared key where ``properties`` is given unless ``additionalProperties`` or
``patternProperties`` allow it. Valid instances outside that policy are counted apart, never dropped.
Each instance is written in one canonical spelling (see :func:`declared_order`): a grammar fixes
the spelling of a value, JSON Schema only judges the value.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator

from hermes_vllm.grammar import CompiledToolGrammar, GrammarCompileError, ToolGrammarCompiler
from hermes_vllm.schema import (
    ANY_ORDER_KEYS,
    ROOT_DEF,
    ToolSchemaError,
    bfcl_to_json_schema,
    canonical_value,
    iter_subschemas,
    resolve_ref,
    value_key,
)
from hermes_vllm.schema.tree import repoint_refs
from support.corpus import BfclCase, bfcl_files, load_bfcl, load_suite_file

JSON = Any
Status = Literal["compiled", "refused", "crashed"]
STATUSES: tuple[Status, ...] = ("crashed", "refused", "compiled")
"""Worst first: a group's status is the worst of its compiles."""

TOOL_NAME = "check"


# --- building the calls -------------------------------------------------------------------------


def embed_as_value(schema: JSON) -> dict[str, JSON]:
    """The arguments schema ``{"value": schema}``, for instances that are not objects.

    The root schema moves to ``$defs/__root__`` and every local reference into it (``#`` itself
    and ``#/...``) is re-pointed there, so that references keep their meaning. The root-only
    identity keywords ``$id`` and ``$schema`` are dropped: kept, they would make the moved schema
    a resource of its own, against which a rewritten ``#/$defs/__root__/...`` means nothing.
    """
    moved = copy.deepcopy(schema)
    if isinstance(moved, dict):
        moved.pop("$id", None)
        moved.pop("$schema", None)
        repoint_refs(moved, f"#/$defs/{ROOT_DEF}")
    return {
        "type": "object",
        "properties": {"value": {"$ref": f"#/$defs/{ROOT_DEF}"}},
        "required": ["value"],
        "$defs": {ROOT_DEF: moved},
    }


def goes_direct(schema: JSON, instance: JSON) -> bool:
    """Whether ``instance`` can be the arguments object itself (else it travels as ``value``).

    Only when the root schema could admit an object: arguments are always an object, so a root
    that admits none would refuse the tool rather than the instance.
    """
    if not (isinstance(schema, dict) and isinstance(instance, dict)):
        return False
    kind = schema.get("type", "object")
    values = [schema["const"]] if "const" in schema else schema.get("enum", [{}])
    return (kind == "object" or (isinstance(kind, list) and "object" in kind)) and any(
        isinstance(v, dict) for v in values
    )


def policy_schema(schema: JSON) -> JSON:
    """``schema`` with our object policy spelled out, for jsonschema: what a grammar must admit.

    An object schema declaring ``properties`` admits no other key unless ``additionalProperties``
    or ``patternProperties`` say otherwise; names it ``required`` count as declared. Written apart
    from ``schema.py`` on purpose: an oracle must not share the code it checks.
    """
    tight = copy.deepcopy(schema)
    for _, sub in list(iter_subschemas(tight)):
        props = sub.get("properties")
        if isinstance(props, dict) and not {"additionalProperties", "patternProperties"} & sub.keys():
            for name in sub.get("required", []):
                if isinstance(name, str):
                    props.setdefault(name, True)
            sub["additionalProperties"] = False
    return tight


def _governing(
    value: JSON, schema: JSON, validator: Draft202012Validator, seen: set[int]
) -> Iterator[dict[str, JSON]]:
    """The schemas whose ``properties`` govern ``value``: itself, its ``$ref`` target, every
    ``allOf`` branch and the first ``anyOf``/``oneOf`` branch that ``value`` satisfies."""
    if not isinstance(schema, dict) or id(schema) in seen:
        return
    seen.add(id(schema))
    yield schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        with suppress(LookupError):
            yield from _governing(value, resolve_ref(validator.schema, ref), validator, seen)
    for branch in schema.get("allOf", []):
        yield from _governing(value, branch, validator, seen)
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key, []):
            if validator.evolve(schema=branch).is_valid(value):
                yield from _governing(value, branch, validator, seen)
                break


def declared_order(value: JSON, schema: JSON, validator: Draft202012Validator) -> JSON:
    """``value`` as the schema spells it: our canonical form of an instance.

    Object keys in declared ``properties`` order, undeclared keys after them; a value equal to a
    ``const`` or ``enum`` member keeps its own key order where every object in the member is small
    enough to be admitted in any order (``ANY_ORDER_KEYS``, JSON object equality ignores order),
    and is written as the member is elsewhere; integral floats as integers. None of this changes
    what the value is to JSON Schema, and it is the form a grammar enforces.
    """
    governing = list(_governing(value, schema, validator, set()))
    for sub in governing:
        members = [sub["const"]] if "const" in sub else sub.get("enum", [])
        if isinstance(value, (dict, list)):
            key = value_key(value)
            for member in members:
                if value_key(member) == key:
                    return canonical_value(value if _small_objects(member) else member)
    if isinstance(value, dict):
        keys: list[str] = []
        for sub in governing:
            keys += [k for k in sub.get("properties", {}) if k in value and k not in keys]
        keys += [k for k in value if k not in keys]
        return {k: declared_order(value[k], _child_schema(governing, k), validator) for k in keys}
    if isinstance(value, list):
        return [declared_order(item, _item_schema(governing, i), validator) for i, item in enumerate(value)]
    return canonical_value(value)


def _small_objects(value: JSON) -> bool:
    """Whether every object inside ``value`` has at most ``ANY_ORDER_KEYS`` keys."""
    if isinstance(value, dict):
        return len(value) <= ANY_ORDER_KEYS and all(map(_small_objects, value.values()))
    return all(map(_small_objects, value)) if isinstance(value, list) else True


def _child_schema(governing: Sequence[dict[str, JSON]], key: str) -> JSON:
    for sub in governing:
        if key in sub.get("properties", {}):
            return sub["properties"][key]
    for sub in governing:
        for pattern, child in sub.get("patternProperties", {}).items():
            if re.search(pattern, key):
                return child
    return next((s["additionalProperties"] for s in governing if "additionalProperties" in s), True)


def _item_schema(governing: Sequence[dict[str, JSON]], index: int) -> JSON:
    for sub in governing:
        prefix = sub.get("prefixItems", [])
        if index < len(prefix):
            return prefix[index]
    return next((s["items"] for s in governing if "items" in s), True)


def tool(params: JSON, name: str = TOOL_NAME) -> dict[str, JSON]:
    """An OpenAI tool definition with ``params`` as its arguments schema."""
    return {"type": "function", "function": {"name": name, "parameters": params}}


def call_text(name: str, arguments: JSON, compact: bool = True) -> str:
    """One hermes tool-call span; arguments compact (``,``/``:``) or as ``json.dumps`` spaces them."""
    separators = (",", ":") if compact else (", ", ": ")
    args = json.dumps(arguments, ensure_ascii=False, separators=separators)
    return f'<tool_call>{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {args}}}</tool_call>'


# --- outcomes -----------------------------------------------------------------------------------


@dataclass
class Compiled:
    """The outcome of compiling one tool set: the grammar, or why there is none."""

    status: Status
    grammar: CompiledToolGrammar | None = None
    message: str = ""


def compile_tools(compiler: ToolGrammarCompiler, tools: Sequence[JSON]) -> Compiled:
    """Compile through the real path in strict coverage; explicit refusals are told from crashes.

    A tool set whose every tool was left out (no call can satisfy them) counts as refused, with
    the reason the server logs: no call can be checked against it.
    """
    try:
        grammar = compiler.compile(list(tools), coverage="strict")
    except (ToolSchemaError, GrammarCompileError) as err:
        return Compiled("refused", message=str(err))
    except Exception as err:  # a crash is a finding, reported with its type
        return Compiled("crashed", message=f"{type(err).__name__}: {err}")
    if grammar.prepared.unusable and not grammar.spec.tools:  # every tool left out: none can be called
        return Compiled("refused", message="; ".join(map(str, grammar.prepared.unusable)))
    return Compiled("compiled", grammar)


@dataclass
class InstanceOutcome:
    """One test instance: its label, whether our policy admits it, and what the grammar did."""

    description: str
    valid: bool
    admitted: bool
    """Valid, and admitted by the object policy (an admitted instance must be accepted)."""
    accepted: bool | None
    """None when the schema was not compiled."""
    text: str
    label_agrees: bool
    """jsonschema on the call's arguments agrees with the suite's label (checks the embedding)."""

    @property
    def failure(self) -> str | None:
        if self.accepted is None:
            return None
        if self.admitted and not self.accepted:
            return "SOUNDNESS BUG"
        if not self.valid and self.accepted:
            return "precision gap"
        return None


@dataclass
class SchemaOutcome:
    """One schema group of a keyword file: compiled, refused (with the message) or crashed."""

    description: str
    status: Status
    messages: list[str]
    instances: list[InstanceOutcome]
    named: list[str] = field(default_factory=list)
    """Keywords of the schema that the refusal messages name (a refusal must name one)."""

    def to_json(self) -> dict[str, JSON]:
        """The outcome, with each instance's call text only where it failed (keeps reports small)."""
        out = asdict(self)
        for raw, instance in zip(out["instances"], self.instances, strict=True):
            if instance.failure is None:
                del raw["text"]
        return out


def _validates(schema: JSON, instance: JSON) -> bool:
    try:
        return bool(Draft202012Validator(schema).is_valid(instance))
    except Exception:  # remote references and the like: no verdict
        return False


def named_keywords(message: str, schema: JSON) -> list[str]:
    """The keywords of ``schema`` (``false`` for a false subschema) that ``message`` names."""
    keys = {"false"} if "false" in json.dumps(schema) else set()
    for _, sub in iter_subschemas(schema):
        keys |= set(sub)
    return sorted(k for k in keys if re.search(rf"(?<![\w$]){re.escape(k)}(?!\w)", message))


def check_group(compiler: ToolGrammarCompiler, group: dict[str, JSON]) -> SchemaOutcome:
    """Check every instance of one suite group (object instances direct, others as ``value``)."""
    schema = group["schema"]
    compiled: dict[bool, Compiled] = {}
    instances = []
    for test in group["tests"]:
        direct = goes_direct(schema, test["data"])
        params = schema if direct else embed_as_value(schema)
        arguments = test["data"] if direct else {"value": test["data"]}
        outcome = compiled.get(direct) or compiled.setdefault(direct, compile_tools(compiler, [tool(params)]))
        admitted = bool(test["valid"]) and _validates(policy_schema(params), arguments)
        accepted = None
        text = call_text(TOOL_NAME, arguments)
        if outcome.grammar is not None:
            enforced = outcome.grammar.spec.tools[0].parameters
            text = call_text(TOOL_NAME, declared_order(arguments, enforced, Draft202012Validator(enforced)))
            accepted = outcome.grammar.matcher().accepts_text(text)
        agrees = _validates(params, arguments) == bool(test["valid"])
        instances.append(
            InstanceOutcome(test["description"], test["valid"], admitted, accepted, text, agrees)
        )
    statuses = {c.status for c in compiled.values()}
    status = next(s for s in STATUSES if s in statuses)
    messages = [c.message for c in compiled.values() if c.message]
    named = sorted({k for m in messages for k in named_keywords(m, schema)})
    return SchemaOutcome(group["description"], status, messages, instances, named)


# Valid instances outside the suite that exercise what xgrammar 0.2.8 is known to get wrong or
# used to: characters JSON must escape inside length- or pattern-bound strings (no rewrite can
# help there: xgrammar admits no escape sequence in such strings), and the open defaults that
# schema.make_explicit now spells out.
PROBES: tuple[tuple[str, JSON, JSON], ...] = (
    ("quote in a maxLength string", {"type": "string", "maxLength": 20}, 'say "hi"'),
    ("newline in a minLength string", {"type": "string", "minLength": 1}, "two\nlines"),
    ("backslash in a pattern string", {"type": "string", "pattern": "^[a-z\\\\]+$"}, "a\\b"),
    ("quote and newline in a plain string", {"type": "string"}, 'say "hi"\n'),
    ("escaped enum members", {"enum": ['a"b', "c\\d", "e\nf"]}, "c\\d"),
    (
        "any keys in a nested object without properties",
        {"type": "object", "properties": {"o": {"type": "object"}}},
        {"o": {"any": 1, "keys": [2]}},
    ),
    ("any items in a nested array without items", {"type": "array"}, [1, "two", {"three": 3}]),
    ("required name without properties", {"type": "object", "required": ["a"]}, {"b": 0, "a": 1}),
    ("bounds in an untyped schema", {"maximum": 3}, "not a number"),
    ("unanchored pattern", {"type": "string", "pattern": "b"}, "abc"),
)
PROBE_FILE = "probes (outside the suite)"


def probe_groups() -> list[dict[str, JSON]]:
    """:data:`PROBES` as suite groups, each with one valid instance."""
    return [
        {"description": d, "schema": s, "tests": [{"description": d, "data": x, "valid": True}]}
        for d, s, x in PROBES
    ]


@dataclass
class SuiteFileReport:
    """One keyword file of the JSON-Schema-Test-Suite, with the counts of the summary table."""

    file: str
    schemas: list[SchemaOutcome]
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        compiled = [s for s in self.schemas if s.status == "compiled"]
        checked = [i for s in compiled for i in s.instances]
        self.counts = {
            "groups": len(self.schemas),
            "compiled": len(compiled),
            "refused": sum(s.status == "refused" for s in self.schemas),
            "crashed": sum(s.status == "crashed" for s in self.schemas),
            "valid_admitted": sum(i.admitted for i in checked),
            "valid_accepted": sum(i.admitted and bool(i.accepted) for i in checked),
            "valid_excluded_by_policy": sum(i.valid and not i.admitted for i in checked),
            "invalid": sum(not i.valid for i in checked),
            "invalid_rejected": sum(not i.valid and not i.accepted for i in checked),
            "label_disagreements": sum(not i.label_agrees for s in self.schemas for i in s.instances),
        }

    def excluded(self) -> list[dict[str, str]]:
        """Valid instances of compiled schemas that our object policy does not admit."""
        return [
            {"schema": s.description, "instance": i.description}
            for s in self.schemas
            if s.status == "compiled"
            for i in s.instances
            if i.valid and not i.admitted
        ]

    def failures(self) -> list[dict[str, str]]:
        """Every soundness bug and precision gap, with enough to reproduce it."""
        return [
            {"kind": kind, "schema": s.description, "instance": i.description, "text": i.text}
            for s in self.schemas
            for i in s.instances
            if (kind := i.failure or "")
        ]

    def to_json(self) -> dict[str, JSON]:
        return {
            "file": self.file,
            "counts": self.counts,
            "failures": self.failures(),
            "excluded_by_policy": self.excluded(),
            "schemas": [s.to_json() for s in self.schemas],
        }


def check_suite_file(compiler: ToolGrammarCompiler, path: Path) -> SuiteFileReport:
    return SuiteFileReport(path.name, [check_group(compiler, g) for g in load_suite_file(path)])


def check_probes(compiler: ToolGrammarCompiler) -> SuiteFileReport:
    return SuiteFileReport(PROBE_FILE, [check_group(compiler, g) for g in probe_groups()])


# --- BFCL -----------------------------------------------------------------------------------------


def ground_truth_arguments(answer: dict[str, list[JSON]]) -> dict[str, JSON]:
    """The first acceptable value of each argument; ``""`` first means "omit it" in BFCL.

    BFCL writes the values of a dict argument (and of dicts inside a list) the same way, as
    lists of acceptable values, so the rule applies inside them too.
    """
    return {arg: _first_acceptable(values[0]) for arg, values in answer.items() if values and values[0] != ""}


def _first_acceptable(value: JSON) -> JSON:
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return ground_truth_arguments(value)
    if isinstance(value, list):
        return [_first_acceptable(v) if isinstance(v, dict) else v for v in value]
    return value


@dataclass
class BfclFileReport:
    """One BFCL file: which tool sets compile, and which ground-truth calls are accepted."""

    file: str
    tool_sets: int = 0
    compiled: int = 0
    not_compiled: list[dict[str, str]] = field(default_factory=list)
    calls: int = 0
    unknown_function: list[dict[str, str]] = field(default_factory=list)
    off_schema: list[dict[str, str]] = field(default_factory=list)
    excluded_by_policy: list[dict[str, str]] = field(default_factory=list)
    on_schema: int = 0
    accepted: int = 0
    rejected: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, JSON]:
        return asdict(self)


def check_bfcl_case(compiler: ToolGrammarCompiler, case: BfclCase, report: BfclFileReport) -> None:
    """Compile one tool set and check each of its on-schema ground-truth calls; counts into ``report``."""
    report.tool_sets += 1
    outcome = compile_tools(compiler, case.tools)
    if outcome.grammar is None:
        report.not_compiled.append({"id": case.id, "status": outcome.status, "message": outcome.message})
        return
    report.compiled += 1
    specs = {s.name: s for s in outcome.grammar.prepared.original}
    written = {t["name"]: t.get("parameters") or {"type": "object"} for t in case.tools}
    for answer in case.ground_truth or []:
        for name, raw_args in answer.items():
            report.calls += 1
            spec = specs.get(name)
            if spec is None:
                report.unknown_function.append({"id": case.id, "function": name})
                continue
            arguments = ground_truth_arguments(raw_args)
            schema = bfcl_to_json_schema(copy.deepcopy(written[name]))  # as written, not as rewritten
            error = next(Draft202012Validator(schema).iter_errors(arguments), None)
            where = {"id": case.id, "function": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
            if error is not None:
                report.off_schema.append({**where, "reason": error.message[:200]})
                continue
            if not _validates(policy_schema(schema), arguments):
                report.excluded_by_policy.append(where)
                continue
            report.on_schema += 1
            validator = Draft202012Validator(spec.parameters)
            text = call_text(name, declared_order(arguments, spec.parameters, validator), compact=False)
            if outcome.grammar.matcher().accepts_text(text):
                report.accepted += 1
            else:
                report.rejected.append({**where, "text": text})


def check_bfcl_file(compiler: ToolGrammarCompiler, path: Path) -> BfclFileReport:
    report = BfclFileReport(path.name)
    for case in load_bfcl(path):
        check_bfcl_case(compiler, case, report)
    return report


def distinct_tools(
    count: int, usable: Callable[[dict[str, Any]], bool]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """``count`` distinct BFCL functions (by name, across files) that ``usable`` accepts, as OpenAI
    tools in standard JSON Schema, and the text of a ground-truth call of those that have one."""
    tools: dict[str, dict[str, Any]] = {}
    calls: dict[str, str] = {}
    for path in bfcl_files():
        for case in load_bfcl(path):
            for fn in case.tools:
                if fn["name"] in tools or len(tools) >= count:
                    continue
                params = bfcl_to_json_schema(copy.deepcopy(fn.get("parameters", {})))
                tool = {"type": "function", "function": {**fn, "parameters": params}}
                if not usable(tool):
                    continue
                tools[fn["name"]] = tool
                answers = [a[fn["name"]] for a in case.ground_truth or [] if fn["name"] in a]
                if answers:
                    calls[fn["name"]] = call_text(
                        fn["name"], ground_truth_arguments(answers[0]), compact=False
                    )
    return list(tools.values()), calls
