"""Tool schemas as clients generate them: pydantic v2 models and the openai SDK's strict form.

Most tool schemas a server sees are made from pydantic models (pydantic-ai, LangChain,
instructor, the OpenAI Agents SDK, MCP servers), and the client validates the call it gets back
against the same model. Each model here is of an everyday kind: discriminated unions, recursive
models, nested and optional models, tuples, enums, literals, sets of enum members and of free
strings and numbers, integer and number multiples, defaults, formatted strings, dicts keyed
by literals and enums and by names of a bounded length or a format, a string holding JSON. Each comes in
three forms: ``model_json_schema()`` as pydantic 2 writes it, the same with every annotated
``$ref`` wrapped in a one-branch ``allOf`` (what pydantic wrote before 2.9 and other generators
still write), and ``openai.pydantic_function_tool`` (the SDK's strict form). Beside them, the
tools real generators write (:mod:`support.real_generators`: LangChain's
``convert_to_openai_tool``, MCP servers' ``list_tools``). The judge of a call is the client's
own model: :meth:`GeneratedTool.accepts`.
"""

from __future__ import annotations

import copy
import datetime
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum, StrEnum
from ipaddress import IPv4Address
from typing import Annotated, Any, Literal

import openai
from jsonschema import Draft202012Validator
from pydantic import AnyUrl, BaseModel, EmailStr, Field, Json, StringConstraints, ValidationError

FORMS = ("pydantic", "allof", "strict")


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = 9


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool
    tricks: list[str] = []


class Fish(BaseModel):
    kind: Literal["fish"]
    water: Literal["salt", "fresh"]


class AdoptPet(BaseModel):
    """A discriminated union of two models, and a plain field beside it."""

    pet: Cat | Dog = Field(discriminator="kind")
    name: str


class AdoptMany(BaseModel):
    """A list of a three-way discriminated union, with a default."""

    pets: list[Annotated[Cat | Dog | Fish, Field(discriminator="kind")]]
    note: str | None = None


class Node(BaseModel):
    """A recursive model: a tree."""

    label: str
    children: list[Node] = []


class SaveTree(BaseModel):
    root: Node
    depth: int | None = None


class Color(StrEnum):
    red = "red"
    green = "green"


class Point(BaseModel):
    x: float
    y: float


class DrawShape(BaseModel):
    """A model field with a description (an annotated ``$ref``), a tuple, nullable enum and union."""

    corner: Point = Field(description="top left corner")
    size: tuple[int, int]
    color: Color | None = None
    tag: int | str | None = None


class Priority(int, Enum):
    low = 1
    high = 2


class CreateTicket(BaseModel):
    """Formatted strings, a Decimal, an integer enum, a free-form dict, defaults."""

    title: str = Field(max_length=80)
    due: datetime.date | None = None
    owner: EmailStr
    ref: uuid.UUID
    amount: Decimal = Decimal("0")
    priority: Priority = Priority.low
    labels: dict[str, str] = {}
    link: AnyUrl | None = None


class Schedule(BaseModel):
    """A model nested in a model in a list, times and durations, a bounded integer."""

    start: datetime.datetime
    every: datetime.timedelta
    at: datetime.time
    host: IPv4Address | None = None
    retries: int = Field(default=3, ge=0, le=10)
    events: list[CreateTicket] = []


class PlanMeeting(BaseModel):
    """Sets of enum members and literals (``uniqueItems``), minutes in steps of 15 (``multipleOf``)."""

    rooms: set[Color]
    days: frozenset[Literal["mon", "tue", "wed"]] = frozenset()
    minutes: int = Field(multiple_of=15)
    start: int = Field(default=0, multiple_of=15, ge=0, lt=60)


class TagPost(BaseModel):
    """Free-form sets (``uniqueItems`` the processor keeps) and stars in halves (a number
    ``multipleOf`` in a bounded range)."""

    tags: set[str] = Field(min_length=2)
    ids: frozenset[int] = frozenset()
    weights: set[float] | None = None
    stars: float = Field(default=0, multiple_of=0.5, ge=0, le=5)


class Level(Enum):
    low = "low"
    high = "high"


class Tally(BaseModel):
    """Counts keyed by each kind of name pydantic writes as ``propertyNames`` (a ``Literal``, an
    ``Enum``, a ``StrEnum``, an integer ``Enum``), and a string holding a JSON list
    (``contentMediaType`` with ``contentSchema``)."""

    by_word: dict[Literal["low", "high"], int]
    by_level: dict[Level, int] = {}
    by_color: dict[Color, int] = {}
    by_priority: dict[Priority, int] = {}
    ids: Json[list[int]]


class Lexicon(BaseModel):
    """Counts keyed by free names under a bound, which pydantic writes as ``propertyNames``: a
    length (``StringConstraints``) and a format (a ``date``)."""

    by_code: dict[Annotated[str, StringConstraints(min_length=2, max_length=3)], int]
    by_day: dict[datetime.date, int] = {}


MODELS: tuple[type[BaseModel], ...] = (
    AdoptPet, AdoptMany, SaveTree, DrawShape, CreateTicket, Schedule, PlanMeeting, TagPost, Tally, Lexicon,
)  # fmt: skip


def as_all_of(schema: Any) -> Any:
    """``schema`` with every ``$ref`` that has sibling keywords written as a one-branch ``allOf``."""
    if isinstance(schema, list):
        return [as_all_of(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: as_all_of(v) for k, v in schema.items()}
    if "$ref" in out and len(out) > 1:
        out["allOf"] = [{"$ref": out.pop("$ref")}]
    return out


@dataclass(frozen=True)
class GeneratedTool:
    """One model in one form, as an OpenAI tool."""

    model: type[BaseModel]
    form: str
    tool: dict[str, Any]
    judge: Callable[[Any], Any] | None = None
    """How the client validates a call, where not ``model.model_validate`` (an MCP server's
    ``validate_arguments``)."""

    @property
    def name(self) -> str:
        return str(self.tool["function"]["name"])

    @property
    def id(self) -> str:
        return f"{self.model.__name__}-{self.form}"

    def accepts(self, arguments: Any) -> str | None:
        """Why the client would reject ``arguments``; ``None`` when its model and jsonschema
        (with format checking, against the schema as sent) both accept them."""
        try:
            (self.judge or self.model.model_validate)(arguments)
        except ValidationError as err:
            return f"{self.model.__name__}.model_validate: {str(err).splitlines()[0]} {err.errors()[0]}"
        checker = Draft202012Validator(
            self.tool["function"]["parameters"], format_checker=Draft202012Validator.FORMAT_CHECKER
        )
        error = next(iter(checker.iter_errors(arguments)), None)
        return None if error is None else f"jsonschema: {error.message}"


def generated_tools(name_suffix: str = "", real: bool = True) -> list[GeneratedTool]:
    """Every model in every form, each tool named after its model and form (plus ``name_suffix``),
    and (``real``) the tools real generators write (:mod:`.real_generators`: LangChain, MCP)."""
    out = []
    for model in MODELS:
        base = model.__name__.lower()
        pydantic_schema = model.model_json_schema()
        schemas = {
            "pydantic": pydantic_schema,
            "allof": as_all_of(copy.deepcopy(pydantic_schema)),
            "strict": openai.pydantic_function_tool(model)["function"]["parameters"],
        }
        for form in FORMS:
            function = {"name": f"{base}_{form}{name_suffix}", "parameters": schemas[form]}
            out.append(GeneratedTool(model, form, {"type": "function", "function": function}))
    if real:
        from support.real_generators import LANGCHAIN, MCP, langchain_tools, mcp_tools

        for form, made in ((LANGCHAIN, langchain_tools()), (MCP, mcp_tools())):
            for model, tool, judge in made:
                function = {**tool["function"], "name": f"{tool['function']['name']}{name_suffix}"}
                out.append(GeneratedTool(model, form, {"type": "function", "function": function}, judge))
    return out
