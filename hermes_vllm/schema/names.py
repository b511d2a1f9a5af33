"""``propertyNames`` on free names: the shape every engine that serves it enforces exactly.

pydantic writes ``dict[Annotated[str, StringConstraints(max_length=2)], V]`` and
``dict[EmailStr, V]`` as an object with ``additionalProperties`` (the value schema) and a
``propertyNames`` of string keywords, with nothing else naming keys (a key ``pattern`` it writes
as ``patternProperties``; other generators write it here). A finite set of
names (an ``enum`` / ``const``) is spelled out as a closed object by the schema rewrites; this
is the rest: names bound by a ``pattern``, a length or a ``format``. xgrammar enforces such a
names schema itself (its key rule is the string rule of the names schema); llguidance 1.7 leaves
``propertyNames`` unimplemented but enforces the same object as one ``patternProperties`` entry
(:func:`as_pattern_properties`); the outlines engine writes a ``format`` on names into its own
regex of the object (it refuses patterns and lengths anywhere). Any other names schema (an
object that also declares ``properties`` or ``patternProperties``, a ``$ref`` or a combinator on
names) is refused under ``propertyNames`` by the coverage check: spelled in another keyword, it
would be refused under a keyword the client never wrote.
"""

from __future__ import annotations

from hermes_vllm.schema.spec import JSON

FREE_NAME_KEYWORDS = frozenset({"pattern", "minLength", "maxLength", "format"})
"""What a served names schema may hold, besides ``"type": "string"`` (a key is a string)."""
FREE_NAMES_REASON = (
    "served only as a 'pattern', a length or a 'format' on the names of an object that declares "
    "no 'properties' or 'patternProperties' beside it"
)


def free_names(sub: dict[str, JSON]) -> dict[str, JSON] | None:
    """``sub``'s names schema where it is the served shape (see the module docstring), else None."""
    names = sub.get("propertyNames")
    if not isinstance(names, dict) or sub.get("properties") or sub.get("patternProperties"):
        return None
    if set(names) - FREE_NAME_KEYWORDS - {"type"} or names.get("type", "string") != "string":
        return None
    return names


def as_pattern_properties(sub: dict[str, JSON]) -> None:
    """A served ``propertyNames`` (:func:`free_names`, its ``format`` already a ``pattern``) as the
    one ``patternProperties`` entry holding ``additionalProperties``, in place: exact, as no other
    keyword names the object's keys. A length becomes a pattern of that many characters; a
    pattern beside a length is refused earlier (no engine intersects the two).
    """
    names = free_names(sub)
    if names is None:
        return
    pattern = names.get("pattern")
    low, high = names.get("minLength", 0), names.get("maxLength")
    if not isinstance(pattern, str):
        pattern = f"^[\\s\\S]{{{low},{'' if high is None else high}}}$"
    del sub["propertyNames"]
    sub["patternProperties"] = {pattern: sub.get("additionalProperties", True)}
    sub["additionalProperties"] = False
