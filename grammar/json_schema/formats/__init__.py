"""Regexes for JSON Schema string formats (the text between the quotes).

Standard formats we cannot express exactly raise UnsupportedSchemaError; formats outside the
JSON Schema vocabulary (e.g. "int32", "color") are annotations and ignored, as the spec says.
Where a format's exact language needs counting or tables (leap seconds at every offset, host
name lengths, punycode labels) the regex is a sound subset: every string it matches is valid,
some valid ones are left out (each place says which). Characters are taken in their literal
spelling, and those JSON must escape in their escape forms (pointers.py). Checked against the
official suite's `optional/format` files by tests/grammar/json_schema/test_conformance.py.

`dates` (date, time, date-time, duration), `hosts` (hostname, ipv4, ipv6, email), `uris` (uri,
uri-reference, iri, iri-reference, uri-template: regex nodes), `pointers` (json-pointer,
relative-json-pointer).
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

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


# the formats' automata without a maxLength, as `prebuild` built or read them
_PREBUILT: dict[str, tuple[object, int | None]] = {}


def format_node(fmt: str, max_length: int | None) -> tuple[object, int | None]:
    """format_regex as a prebuilt automaton shared by every schema (a format's NFA is large:
    an IP literal's alternatives; embedded, a schema holding a format in many places builds
    none of its states), keeping its regex text for json_schema_to_regex."""
    if max_length is None and fmt in _PREBUILT:
        return _PREBUILT[fmt]
    return _built_node(fmt, max_length)


@functools.lru_cache(maxsize=256)
def _built_node(fmt: str, max_length: int | None) -> tuple[object, int | None]:
    if fmt in _NODES:
        node, text, hi = _NODES[fmt](), FORMAT_REGEXES[fmt], max_length
    else:
        text, hi = format_regex(fmt, max_length)
        node = ra.parsed(text)
    return dfa_ops.DFANode(node_to_dfa(node), "format", "#", text), hi


def prebuild() -> None:
    """Every supported format's shared automaton now, so that no schema's compile pays for
    one (a server and each compile worker call this at start: `grammar.prebuild`). Building
    them takes ~1.2 s of CPU; they are kept in the native cache folder ($SGL_NATIVE_CACHE),
    keyed by the grammar package's source, and read from there (~1 ms) by later processes."""
    if _PREBUILT:
        return
    wanted = [fmt for fmt in FORMAT_REGEXES if fmt not in UNSUPPORTED_FORMATS]
    path = _prebuilt_path()
    try:
        kept = pickle.loads(path.read_bytes()) if path is not None else None
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ValueError):
        kept = None  # missing, or not what this source writes: build them
    if isinstance(kept, dict) and set(kept) == set(wanted):
        _PREBUILT.update(kept)
        return
    built = {fmt: _built_node(fmt, None) for fmt in wanted}
    _PREBUILT.update(built)
    if path is not None:
        try:  # written beside and renamed into place: processes starting at once
            fd, tmp = tempfile.mkstemp(prefix=".formats-", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                pickle.dump(built, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache: built again by the next process


def forget_built() -> None:
    """Drop the format automata built or read in this process (as in a fresh one)."""
    _PREBUILT.clear()
    _built_node.cache_clear()


def _prebuilt_path() -> Path | None:
    """The cache file of the prebuilt formats: keyed by every source file of the grammar
    package (what builds them), the versions of Python, numpy and interegular (what they
    are made of and parsed with; None: no usable cache folder)."""
    from importlib import metadata

    import numpy

    from grammar import native_build

    package = Path(__file__).resolve().parents[2]
    versions = [sys.version, numpy.__version__, metadata.version("interegular")]
    digest = hashlib.sha256(repr(versions).encode())
    for source in sorted(package.rglob("*.py")):
        digest.update(str(source.relative_to(package)).encode() + b"\0" + source.read_bytes())
    try:
        return native_build.cache_dir() / f"formats-{digest.hexdigest()[:24]}.pickle"
    except OSError:
        return None
