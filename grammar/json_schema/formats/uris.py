"""URIs (RFC 3986), IRIs (RFC 3987) and URI templates (RFC 6570 with erratum 6937), built as
regex nodes: an IRI's ucschar class holds about a million code points (written as the
complement, still about 140,000), and interegular would make a set of them at every place regex text
writes the class (a node is one shared class).

Every character is taken in its literal spelling (none of these grammars allows one that
JSON must escape).
"""

from __future__ import annotations

import functools
import string

from grammar.automata import regex_ast as ra
from grammar.json_schema.formats.hosts import ipv6

Node = object
_PCT = "%[0-9A-Fa-f]{2}"
_UNRESERVED = string.ascii_letters + string.digits + "-._~"
_SUB_DELIMS = "!$&'()*+,;="
_PLANE_ENDS = [((p << 16) | 0xFFFE, (p << 16) | 0xFFFF) for p in range(1, 17)]
# what ucschar and iprivate leave out: ASCII (the ASCII classes beside them take their part)
# and C1 controls, noncharacters, tags (surrogates aside: UTF-8 has none)
_NOT_UCS_OR_PRIVATE = [(0, 0x9F), (0xFDD0, 0xFDEF), (0xFFF0, 0xFFFF), (0xE0000, 0xE0FFF)]
_PRIVATE = [(0xE000, 0xF8FF), (0xF0000, 0x10FFFF)]  # iprivate (with plane 15/16 ends)


@functools.cache
def _ucs(private: bool) -> Node:
    """ucschar (and iprivate if `private`) as the complement of what they leave out, the
    smaller set."""
    gaps = _NOT_UCS_OR_PRIVATE + _PLANE_ENDS + ([] if private else _PRIVATE)
    return ra.char_class(frozenset(chr(c) for lo, hi in gaps for c in range(lo, hi + 1)), True)


def _chars(ascii_chars: str, ucs: Node | None = None) -> Node:
    """One of the ASCII characters, a %XX triplet, or a character of `ucs`."""
    return ra.alt([ra.char_class(frozenset(ascii_chars)), ra.parsed(_PCT), ucs])


def _any(node: Node, lo: int = 0) -> Node:
    return ra.repeat(node, lo, None)


@functools.cache
def _grammar(iri: bool) -> tuple[Node, Node]:
    """(URI, URI-reference) of RFC 3986, or (IRI, IRI-reference) of RFC 3987 (the same
    productions, with ucschar in iunreserved and iprivate also in queries).

    A "//" starts an authority, [userinfo "@"] host [":" port], the host an IP literal
    ("[" IPv6 or IPvFuture "]") or a reg-name (which IPv4 addresses also are); else the path
    is absolute ("/" not followed by "/"), rootless or empty, and in a relative reference its
    first segment has no ":" (it would read as a scheme). One "?" query and one "#" fragment
    at most."""
    ucs = _ucs(False) if iri else None
    ucs_private = _ucs(True) if iri else None
    base = _UNRESERVED + _SUB_DELIMS
    pchar = _chars(base + ":@", ucs)
    segments = _any(ra.seq(ra.char("/"), _any(pchar)))
    future = ra.seq(ra.parsed(r"[vV][0-9A-Fa-f]+\."), _any(ra.char_class(frozenset(base + ":")), 1))
    ip_literal = ra.seq(ra.char("["), ra.alt([ra.parsed(ipv6()), future]), ra.char("]"))
    host = ra.alt([ip_literal, _any(_chars(base, ucs))])
    userinfo = ra.seq(_any(_chars(base + ":", ucs)), ra.char("@"))
    authority = ra.seq(ra.optional(userinfo), host, ra.parsed("(:[0-9]*)?"))
    net_path = ra.seq(ra.lit("//"), authority, segments)
    tail = ra.seq(
        ra.optional(ra.seq(ra.char("?"), _any(_chars(base + ":@/?", ucs_private)))),
        ra.optional(ra.seq(ra.char("#"), _any(_chars(base + ":@/?", ucs)))),
    )
    # written so that each class appears in few places (regex text repeats a shared node,
    # and an IRI class is large): after a scheme, an absolute, rootless or empty path is
    # ["/"] [segment-nz *("/" segment)]; a relative path is that after "/", or starts with
    # a segment without ":"
    path = ra.optional(ra.seq(_any(pchar, 1), segments))
    scheme = ra.seq(ra.parsed(r"[a-zA-Z][a-zA-Z0-9+.\-]*"), ra.char(":"))
    no_scheme = ra.seq(_any(_chars(base + "@", ucs), 1), segments)
    absolute = ra.seq(scheme, ra.alt([net_path, ra.seq(ra.optional(ra.char("/")), path)]), tail)
    reference = ra.alt(
        [
            ra.seq(ra.optional(scheme), net_path),
            ra.seq(ra.alt([ra.seq(scheme, ra.optional(ra.char("/"))), ra.char("/")]), path),
            no_scheme,
        ]
    )
    return absolute, ra.seq(ra.optional(reference), tail)


def uri() -> Node:
    return _grammar(False)[0]


def uri_reference() -> Node:
    return _grammar(False)[1]


def iri() -> Node:
    return _grammar(True)[0]


def iri_reference() -> Node:
    return _grammar(True)[1]


# RFC 6570 literals: %x21 / %x23-24 / %x26-3B / %x3D / %x3F-5B / %x5D / %x5F / %x61-7A / %x7E
# (erratum 6937 put the apostrophe, %x27, back), ucschar, iprivate, pct-encoded
_LITERALS = [(0x21, 0x21), (0x23, 0x24), (0x26, 0x3B), (0x3D, 0x3D), (0x3F, 0x5B), (0x5D, 0x5D)]
_LITERALS += [(0x5F, 0x5F), (0x61, 0x7A), (0x7E, 0x7E)]


@functools.cache
def uri_template() -> Node:
    """Literals and expressions of all four levels: "{" [operator] varspec *("," varspec)
    "}", a varspec a variable name (characters or %XX triplets, single dots between them)
    with a prefix `:n` (1..9999, no leading zero) or an explode `*`. The operators include
    those RFC 6570 reserves for extensions (= , ! @ |), which its grammar admits."""
    literal_ascii = "".join(chr(c) for lo, hi in _LITERALS for c in range(lo, hi + 1))
    literal = _chars(literal_ascii, _ucs(True))
    varchar = _chars(string.ascii_letters + string.digits + "_")
    varname = ra.seq(varchar, _any(ra.seq(ra.optional(ra.char(".")), varchar)))
    varspec = ra.seq(varname, ra.parsed(r"(:[1-9][0-9]{0,3}|\*)?"))
    operator = ra.optional(ra.char_class(frozenset("+#./;?&=,!@|")))
    expression = ra.seq(
        ra.char("{"), operator, varspec, _any(ra.seq(ra.char(","), varspec)), ra.char("}")
    )
    return _any(ra.alt([literal, expression]))
