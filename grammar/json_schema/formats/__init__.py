"""Regexes for JSON Schema string formats (the text between the quotes).

Standard formats we cannot express exactly raise UnsupportedSchemaError; formats outside the
JSON Schema vocabulary (e.g. "int32", "color") are annotations and ignored, as the spec says.
Where a format's exact language needs counting or tables (leap seconds at every offset, host
name lengths, punycode labels) the regex is a sound subset: every string it matches is valid,
some valid ones are left out (each place says which). Characters are taken in their literal
spelling, and those JSON must escape in their escape forms (pointers.py). Checked against the
official suite's `optional/format` files by tests/test_grammar_conformance.py.

`dates` (date, time, date-time, duration), `hosts` (hostname, ipv4, ipv6, email), `uris` (uri,
uri-reference, iri, iri-reference, uri-template: regex nodes), `pointers` (json-pointer,
relative-json-pointer).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping

from grammar.automata import dfa_ops
from grammar.automata import regex_ast as ra
from grammar.automata.fsm import node_to_dfa
from grammar.json_schema.formats import dates, hosts, pointers, uris

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_TEXTS: dict[str, str] = {
    "date": dates.DATE,
    "time": dates.TIME,
    "date-time": rf"{dates.DATE}[Tt]{dates.TIME}",
    "duration": dates.DURATION,
    "uuid": _UUID,
    "email": hosts.email(hosts.QUOTED_TEXT),
    "hostname": hosts.HOSTNAME,
    "ipv4": hosts.IPV4,
    "ipv6": hosts.ipv6(),
    "json-pointer": pointers.json_pointer(as_text=True),
    "relative-json-pointer": pointers.relative_json_pointer(as_text=True),
}
# formats built as regex nodes (their classes are too large for regex text: see uris)
_NODES: dict[str, Callable[[], object]] = {
    "uri": uris.uri,
    "uri-reference": uris.uri_reference,
    "iri": uris.iri,
    "iri-reference": uris.iri_reference,
    "uri-template": uris.uri_template,
}


class _Regexes(Mapping[str, str]):
    """format -> regex text (valid for Python's `re` too); a format built as a node is
    written out the first time it is read."""

    def __init__(self, texts: dict[str, str]) -> None:
        self._texts = dict(texts)

    def __getitem__(self, fmt: str) -> str:
        if fmt not in self._texts and fmt in _NODES:
            self._texts[fmt] = ra.to_text(_NODES[fmt]())
        return self._texts[fmt]

    def __contains__(self, fmt: object) -> bool:  # without writing a node-built one out
        return isinstance(fmt, str) and (fmt in self._texts or fmt in _NODES)

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self._texts), **dict.fromkeys(_NODES)})

    def __len__(self) -> int:
        return len(set(self._texts) | set(_NODES))


FORMAT_REGEXES: Mapping[str, str] = _Regexes(_TEXTS)

# the same languages over decoded values (what a string is, not how JSON spells it): they
# differ where a format's characters need escapes in JSON (a quoted local part's quotes)
FORMAT_VALUE_REGEXES: Mapping[str, str] = _Regexes(
    {
        **_TEXTS,
        "email": hosts.email(hosts.QUOTED_VALUE),
        "json-pointer": pointers.json_pointer(as_text=False),
        "relative-json-pointer": pointers.relative_json_pointer(as_text=False),
    }
)

# standard formats whose exact language we do not build: refuse rather than ignore
# (idn-*: IDNA 2008 needs Unicode tables and contextual rules; regex: ECMA 262 is not regular)
UNSUPPORTED_FORMATS = frozenset({"idn-email", "idn-hostname", "regex"})
# formats whose regex leaves valid strings out (leap seconds, A-labels, lower-case duration
# designators, index manipulation): an automaton of them must not be subtracted (oneOf)
INEXACT_FORMATS = frozenset(
    {"time", "date-time", "hostname", "email", "duration", "relative-json-pointer"}
)


def format_regex(fmt: str, max_length: int | None) -> tuple[str, int | None]:
    """(regex, maxLength still to count) for a format under a maxLength: a host name within
    253 characters needs only its labels' lengths (none within 63), so the product with
    the length counter stays small; past 253 the maxLength is implied. An e-mail address
    holds at most 254 characters (RFC 5321), so a larger maxLength counts to 254 only; an
    e-mail under a maxLength is generated without address literals ([IPv4], [IPv6:...]),
    whose states the count would multiply."""
    if fmt == "email" and max_length is not None:  # RFC 5321: a path holds 256 octets
        return hosts.email(hosts.QUOTED_TEXT, literals=False), min(max_length, 254)
    if fmt != "hostname" or max_length is None:
        return FORMAT_REGEXES[fmt], max_length
    if max_length >= 253:
        return hosts.HOSTNAME, None
    return hosts.labels(None if max_length <= 63 else 63), max_length


@functools.lru_cache(maxsize=256)
def format_node(fmt: str, max_length: int | None) -> tuple[object, int | None]:
    """format_regex as a prebuilt automaton shared by every schema (a format's NFA is large:
    an IP literal's alternatives; embedded, a schema holding a format in many places builds
    none of its states), keeping its regex text for json_schema_to_regex."""
    if fmt in _NODES:
        node, text, hi = _NODES[fmt](), FORMAT_REGEXES[fmt], max_length
    else:
        text, hi = format_regex(fmt, max_length)
        node = ra.parsed(text)
    return dfa_ops.DFANode(node_to_dfa(node), "format", "#", text), hi


def prebuild() -> None:
    """Build every supported format's shared automaton now (~0.3 s, once per process), so
    that no schema's compile pays for one (a server calls this at start: `grammar.prebuild`)."""
    for fmt in FORMAT_REGEXES:
        if fmt not in UNSUPPORTED_FORMATS:
            format_node(fmt, None)
