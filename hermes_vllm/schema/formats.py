"""String ``format`` values enforced as regular expressions, the same on every engine.

Clients that build schemas from pydantic models or through OpenAI's strict mode send ``format``
on dates, times, UUIDs, addresses and URIs, and validate the call against it. The engines' own
format grammars reject valid strings (outlines-core's ``date-time`` wants exactly three fraction
digits and no offset), so each engine gets the patterns below instead, written from the formats'
grammars (RFC 3339, RFC 5321, RFC 1123, RFC 2673, RFC 4291, RFC 4122, RFC 3986) and checked
against the JSON-Schema-Test-Suite's ``optional/format`` files. Only ASCII classes are used: a
pattern's ``\\d`` would admit other scripts' digits, which no format allows.

Where a pattern cannot be exact it admits more, never less, except where the client's own
validator (pydantic) rejects what the RFC allows, noted on :data:`FORMAT_PATTERNS`; the keyword table
of docs/json-schema.md lists each one.
"""

from __future__ import annotations

import copy
import logging
from typing import Final

from hermes_vllm.schema.spec import JSON
from hermes_vllm.schema.tree import iter_subschemas

logger = logging.getLogger(__name__)

_DIGIT = "[0-9]"
_HEX = "[0-9A-Fa-f]"


def _join(*alternatives: str) -> str:
    return "(" + "|".join(alternatives) + ")"


# RFC 3339: a date's day depends on its month, and 29 February on a leap year (the Gregorian
# rule on four digits is a finite set, hence regular). Year 0000 is left out: RFC 3339 allows it,
# but Python's dates, jsonschema's own ``date`` check and pydantic reject it.
_YEAR = _join("[1-9][0-9]{3}", "0[1-9][0-9]{2}", "00[1-9][0-9]", "000[1-9]")
_LEAP_YEAR = _join("[0-9]{2}(0[48]|[2468][048]|[13579][26])", "([2468][048]|[13579][26]|0[48])00")
_MONTH_DAY = _join(
    "(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])",
    "(0[469]|11)-(0[1-9]|[12][0-9]|30)",
    "02-(0[1-9]|1[0-9]|2[0-8])",
)
_DATE = _join(f"{_YEAR}-{_MONTH_DAY}", f"{_LEAP_YEAR}-02-29")
# No leap second (``:60``): RFC 3339 allows one where the time is 23:59 in UTC, but the client
# judges the call, and pydantic's ``datetime`` and ``time`` (like Python's) reject every one.
# These are the only valid ``date-time`` / ``time`` strings refused.
_TIME = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
# RFC 3339 appendix A, rule by rule: weeks stand alone, a unit never repeats or goes back, and
# ``T`` is followed by at least one time unit.
_N = f"{_DIGIT}+"
_DUR_TIME = f"T{_join(f'{_N}H({_N}M({_N}S)?)?', f'{_N}M({_N}S)?', f'{_N}S')}"
_DUR_DATE = _join(f"{_N}D", f"{_N}M({_N}D)?", f"{_N}Y({_N}M({_N}D)?)?") + f"({_DUR_TIME})?"
_DURATION = f"P{_join(_DUR_DATE, _DUR_TIME, f'{_N}W')}"

# RFC 1123 labels (at most 63 characters, no hyphen at either end). The whole name's limit of
# 253 characters is not kept: counting it across labels would multiply the automaton.
_LABEL = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = f"{_LABEL}(\\.{_LABEL})*"

_OCTET = _join("25[0-5]", "2[0-4][0-9]", "1[0-9]{2}", "[1-9]?[0-9]")
_IPV4 = f"{_OCTET}(\\.{_OCTET}){{3}}"


def _ipv6() -> str:
    """RFC 4291 section 2.2 as RFC 3986 writes it: eight groups, one ``::`` at most, and an IPv4
    address in the last two groups' place."""
    h16 = f"{_HEX}{{1,4}}"
    ls32 = _join(f"{h16}:{h16}", _IPV4)

    def groups(n: int) -> str:
        return f"({h16}:){{{n}}}" if n else ""

    def before(n: int) -> str:  # at most n groups before "::"
        if n < 0:
            return ""
        return f"(({h16}:){{0,{n}}}{h16})?" if n else f"({h16})?"

    forms = [f"{groups(6)}{ls32}", f"::{groups(5)}{ls32}"]
    forms += [f"{before(k - 1)}::{groups(4 - k)}{ls32}" for k in range(1, 5)]
    forms += [f"{before(4)}::{ls32}", f"{before(5)}::{h16}", f"{before(6)}::"]
    return _join(*forms)


_IPV6 = _ipv6()

# RFC 5321's Mailbox: a dot-string or quoted local part, and a domain or an address literal. The
# domain needs a dot: RFC 5321 admits a bare label, but no public address has one and pydantic's
# ``EmailStr`` rejects it (the shortest address is then ``a@a.a``, which both accept).
_ATEXT = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_DOT_STRING = f"{_ATEXT}+(\\.{_ATEXT}+)*"
_QUOTED = '"([ !#-\\[\\]-~]|\\\\[ -~])*"'
_DOMAIN = _join(f"{_LABEL}(\\.{_LABEL})+", f"\\[{_IPV4}\\]", f"\\[IPv6:{_IPV6}\\]")
_EMAIL = f"{_join(_DOT_STRING, _QUOTED)}@{_DOMAIN}"
_EMAIL_UNQUOTED = f"{_DOT_STRING}@{_DOMAIN}"

# RFC 3986 section 3, an absolute URI with an optional fragment. Classes end with ``-``, where it
# cannot read as a range. A port above 65535 is refused although RFC 3986 allows any digits:
# no such port exists, and pydantic's URL types reject it.
_UNRESERVED = "A-Za-z0-9._~"
_SUB_DELIMS = "!$&'()*+,;="
_PCT = f"%{_HEX}{_HEX}"
_PCHAR = _join(f"[{_UNRESERVED}{_SUB_DELIMS}:@-]", _PCT)
_SEGMENT = f"{_PCHAR}*"
_IPV_FUTURE = f"v{_HEX}+\\.[{_UNRESERVED}{_SUB_DELIMS}:-]+"
_IP_LITERAL = f"\\[{_join(_IPV6, _IPV_FUTURE)}\\]"
_HOST = _join(_IP_LITERAL, _join(f"[{_UNRESERVED}{_SUB_DELIMS}-]", _PCT) + "*")
_USERINFO = _join(f"[{_UNRESERVED}{_SUB_DELIMS}:-]", _PCT) + "*"
_PORT = "0*" + _join("[1-5]?[0-9]{1,4}", "6[0-4][0-9]{3}", "65[0-4][0-9]{2}", "655[0-2][0-9]", "6553[0-5]")
_AUTHORITY = f"({_USERINFO}@)?{_HOST}(:({_PORT})?)?"
_HIER_PART = _join(
    f"//{_AUTHORITY}(/{_SEGMENT})*",
    f"/({_PCHAR}+(/{_SEGMENT})*)?",
    f"{_PCHAR}+(/{_SEGMENT})*",
    "",
)
_QUERY = _join(_PCHAR, "[/?]") + "*"
_URI = f"[A-Za-z][A-Za-z0-9+.-]*:{_HIER_PART}(\\?{_QUERY})?(#{_QUERY})?"


def _uuid(version: str = _HEX, variant: str = _HEX) -> str:
    return f"{_HEX}{{8}}-{_HEX}{{4}}-{version}{_HEX}{{3}}-{variant}{_HEX}{{3}}-{_HEX}{{12}}"


FORMAT_PATTERNS: Final[dict[str, str]] = {
    name: f"^{body}$"
    for name, body in {
        "date-time": f"{_DATE}[Tt]{_TIME}",
        "date": _DATE,
        "time": _TIME,
        "duration": _DURATION,
        "email": _EMAIL,
        "hostname": _HOSTNAME,
        "ipv4": _IPV4,
        "ipv6": _IPV6,
        "uuid": _uuid(),
        "uri": _URI,
        # pydantic's UUID1/3/4/5 types say these, and check the version and the RFC 4122 variant.
        **{f"uuid{v}": _uuid(v, "[89ABab]") for v in "1345"},
        "ipvanyaddress": _join(_IPV4, _IPV6),  # pydantic's IPvAnyAddress
    }.items()
}
"""Each enforced format's strings as a whole-match regex over the decoded string. Not exact:
a hostname of any total length is admitted; a leap second, year 0000, a dotless e-mail domain and
a port above 65535 are refused although the RFCs allow them, since the client's pydantic model
rejects each (see the comments above)."""

RAW_SAFE_PATTERNS: Final[dict[str, str]] = {**FORMAT_PATTERNS, "email": f"^{_EMAIL_UNQUOTED}$"}
"""The patterns for engines that match a pattern against the string's JSON spelling, escapes and
all (xgrammar, outlines-core): no pattern may name a quote or a backslash there, so an e-mail
address's quoted local part (``"joe bloggs"@example.com``) is left out of theirs."""

_STRING_KEYWORDS = frozenset({"pattern", "enum", "const"})
"""Beside these ``format`` stays an annotation: two patterns cannot be intersected here, and a
listed value says what it is."""
_LENGTHS = ("minLength", "maxLength")
_COMBINATORS = frozenset({"$ref", "anyOf", "oneOf", "allOf", "not", "if"})
"""Beside these engines ignore a string keyword; pydantic never puts ``format`` there."""


def keep_enforced_formats(schema: JSON) -> None:
    """Keep ``format`` where it is enforced (a known format on a string schema), drop it elsewhere.

    Elsewhere it stays what 2020-12 makes it by default, an annotation: an unknown format, or one
    beside a keyword that settles the string otherwise (:data:`_STRING_KEYWORDS`) or beside a
    combinator, or on a schema whose type does not say string. No format admits the empty
    string, so a ``minLength`` of 1 beside a kept one says nothing more and goes (pydantic's URL
    types write it): an engine that cannot combine a pattern with a length then enforces the
    format.
    """
    for path, sub in iter_subschemas(schema):
        name = sub.get("format")
        if name is None:
            continue
        kinds = sub.get("type")
        stringy = kinds == "string" or (isinstance(kinds, list) and "string" in kinds)
        if not (name in FORMAT_PATTERNS and stringy and not (_STRING_KEYWORDS | _COMBINATORS) & sub.keys()):
            if name in FORMAT_PATTERNS:
                logger.info("format %r at %s is not enforced: it sits beside %s", name, path, sorted(sub))
            del sub["format"]
        elif sub.get("minLength") in (0, 1):
            del sub["minLength"]


def formats_as_patterns(schema: JSON, raw_safe: bool = False) -> JSON:
    """A copy of ``schema`` with each enforced ``format`` replaced by its ``pattern``.

    ``raw_safe`` picks :data:`RAW_SAFE_PATTERNS`, for engines that match a pattern against the
    JSON spelling of the string (xgrammar, outlines-core); neither combines a pattern with a
    length bound, so beside one the format stays unenforced there (the ``auto`` engine sends
    such a schema to llguidance, which does). Run after :func:`keep_enforced_formats`: any
    ``format`` left is one of ours.
    """
    if not any("format" in sub for _, sub in iter_subschemas(schema)):
        return schema
    table = RAW_SAFE_PATTERNS if raw_safe else FORMAT_PATTERNS
    out = copy.deepcopy(schema)
    for _, sub in iter_subschemas(out):
        name = sub.pop("format", None)
        if isinstance(name, str) and name in table and not (raw_safe and any(k in sub for k in _LENGTHS)):
            sub["pattern"] = table[name]
    return out
