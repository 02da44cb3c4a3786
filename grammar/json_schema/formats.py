"""Regexes for JSON Schema string formats (the text between the quotes).

Standard formats we cannot express exactly raise UnsupportedSchemaError; formats outside the
JSON Schema vocabulary (e.g. "int32", "color") are annotations and ignored, as the spec says.
Where a format's exact language needs counting or tables (leap seconds at every offset, host
name lengths, punycode labels) the regex is a sound subset: every string it matches is valid,
some valid ones are left out (each place says which). Checked against the official suite's
`optional/format` files by tests/test_grammar_conformance.py.
"""

from __future__ import annotations

_YEAR = "[0-9]{4}"
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
_DATE = (  # exact calendar dates, leap years included
    rf"({_YEAR}-(0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])"
    rf"|{_YEAR}-(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    rf"|{_YEAR}-02-(0[1-9]|1[0-9]|2[0-8])"
    rf"|{_LEAP_YEAR}-02-29)"
)
_SECFRAC = r"(\.[0-9]+)?"
_NUMOFFSET = r"[+\-]([01][0-9]|2[0-3]):[0-5][0-9]"


def _leap_seconds() -> str:
    """`HH:MM:60` only where the time is 23:59:60 UTC once the offset is applied (RFC 3339),
    for offsets of whole, half and three-quarter hours (Z, +05:30, -09:45, ...): the local
    minute then fixes the offset, and leap seconds at other offsets are left out (valid,
    rarely used, and each minute of offset would be a state of its own)."""
    by_local: dict[int, list[str]] = {1439: ["[Zz]"]}
    for sign in (1, -1):
        for hours in range(24):
            for minutes in (0, 30, 45):
                offset = sign * (60 * hours + minutes)
                local = (1439 + offset) % 1440
                text = (r"\+" if sign > 0 else r"\-") + f"{hours:02d}:{minutes:02d}"
                by_local.setdefault(local, []).append(text)
    forms = [
        f"{local // 60:02d}:{local % 60:02d}:60{_SECFRAC}({'|'.join(offsets)})"
        for local, offsets in sorted(by_local.items())
    ]
    return "(" + "|".join(forms) + ")"


_TIME = (
    rf"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]{_SECFRAC}([Zz]|{_NUMOFFSET})"
    rf"|{_leap_seconds()})"
)
_A = "[a-zA-Z0-9]"
_X = "[a-zA-Z0-9\\-]"


def _label(n: int | None) -> str:
    """An LDH label of 1..n characters (any number if None; no leading / trailing hyphen)
    without hyphens in both its 3rd and 4th places: those are reserved (RFC 5891: "xn--"
    A-labels, whose punycode and IDNA rules are not checked here, so they are left out)."""
    middle = "*" if n is None else f"{{0,{n - 5}}}"
    return rf"{_A}({_A}|{_X}{_A}|{_X}{{2}}{_A}|{_X}({_A}{_X}|\-{_A}){_X}{middle}{_A})?"


def _labels(n: int | None) -> str:
    return rf"{_label(n)}(\.{_label(n)})*"


# labels of at most 63 characters and at most 253 in all (RFC 1123): by the number of
# labels, so that the total holds without counting (up to 3 of 63, 4 of 62, 8 of 30, 16 of
# 14; longer names are left out). Under a maxLength the total is counted instead (below).
_HOST_SHAPES = ((63, 0, 2), (62, 3, 3), (30, 4, 7), (14, 8, 15))
_HOSTNAME = (
    "(" + "|".join(rf"{_label(n)}(\.{_label(n)}){{{lo},{hi}}}" for n, lo, hi in _HOST_SHAPES) + ")"
)


def format_regex(fmt: str, max_length: int | None) -> tuple[str, int | None]:
    """(regex, maxLength still to count) for a format under a maxLength: a host name within
    253 characters needs only its labels' lengths (none within 63), so the product with
    the length counter stays small; past 253 the maxLength is implied. An e-mail address
    holds at most 254 characters (RFC 5321), so a larger maxLength counts to 254 only; an
    e-mail under a maxLength is generated without address literals ([IPv4], [IPv6:...]),
    whose states the count would multiply."""
    if fmt == "email" and max_length is not None:  # RFC 5321: a path holds 256 octets
        return _email(_QUOTED, literals=False), min(max_length, 254)
    if fmt != "hostname" or max_length is None:
        return FORMAT_REGEXES[fmt], max_length
    if max_length >= 253:
        return _HOSTNAME, None
    return _labels(None if max_length <= 63 else 63), max_length


_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# RFC 3986 without IP-literal hosts ("[...]" is not generated). A "//" starts an authority,
# [userinfo "@"] host [":" port] (the host a reg-name, which IPv4 addresses also are, the port
# digits); else the path is absolute ("/" not followed by "/"), rootless or empty, and in a
# relative reference its first segment has no ":" (it would read as a scheme). One "?" query
# and one "#" fragment at most.
_UNRESERVED_SUB = r"[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2}"
_PCHAR = rf"({_UNRESERVED_SUB}|[:@])"
_SEGMENTS = rf"(/{_PCHAR}*)*"
_AUTHORITY = rf"(({_UNRESERVED_SUB}|:)*@)?({_UNRESERVED_SUB})*(:[0-9]*)?"
_QUERY_FRAGMENT = rf"(\?({_PCHAR}|[/?])*)?(#({_PCHAR}|[/?])*)?"
_HIER_PART = rf"(//{_AUTHORITY}{_SEGMENTS}|/({_PCHAR}+{_SEGMENTS})?|{_PCHAR}+{_SEGMENTS}|)"
_RELATIVE_PART = (
    rf"(//{_AUTHORITY}{_SEGMENTS}|/({_PCHAR}+{_SEGMENTS})?|({_UNRESERVED_SUB}|@)+{_SEGMENTS}|)"
)
_SCHEME = r"[a-zA-Z][a-zA-Z0-9+.\-]*"
_H16 = "[0-9A-Fa-f]{1,4}"


def _ipv6() -> str:
    """RFC 4291 text forms: eight groups, "::" for one or more zero groups, and an IPv4 tail
    in place of the last two groups (what Python's ipaddress accepts, no zone id)."""
    v4 = rf"({_OCTET}\.){{3}}{_OCTET}"

    def groups(n: int) -> str:  # n groups joined by ":"
        return "" if n == 0 else rf"{_H16}(:{_H16}){{{n - 1}}}"

    forms = [rf"({_H16}:){{7}}{_H16}", rf"({_H16}:){{6}}{v4}"]
    for left in range(8):
        for right in range(8 - left):  # "::" stands for at least one group
            if left + right <= 7:
                forms.append(f"{groups(left)}::{groups(right)}")
            if left + right <= 5:
                tail = f"{groups(right)}:" if right else ""
                forms.append(f"{groups(left)}::{tail}{v4}")
    return "(" + "|".join(forms) + ")"


def _email(quoted: str, literals: bool = True) -> str:
    """RFC 5321 mailboxes: a dot-atom local part (RFC 5322 atext runs joined by single dots)
    or a quoted string (`quoted`: as JSON string content, or as the decoded value), "@",
    then a domain (host name labels, their lengths not counted: an e-mail's maxLength
    then stays a small product) or an address literal ([IPv4] or [IPv6:...])."""
    atom = r"[a-zA-Z0-9!#$%&'*+/=?^_`{|}~\-]+"
    v4 = rf"({_OCTET}\.){{3}}{_OCTET}"
    literal = rf"|\[{v4}\]|\[IPv6:{_ipv6()}\]" if literals else ""
    return rf"({atom}(\.{atom})*|{quoted})@({_labels(None)}{literal})"


_QUOTED = r'\\"([ !#-\[\]-~]|\\\\([ !#-\[\]-~]|\\\\|\\"))*\\"'  # as JSON string content
FORMAT_REGEXES: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}[Tt]{_TIME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": _email(_QUOTED),
    "hostname": _HOSTNAME,
    "ipv4": rf"({_OCTET}\.){{3}}{_OCTET}",
    "ipv6": _ipv6(),
    "uri": rf"{_SCHEME}:{_HIER_PART}{_QUERY_FRAGMENT}",
    "uri-reference": (rf"({_SCHEME}:{_HIER_PART}|{_RELATIVE_PART}){_QUERY_FRAGMENT}"),
}

# standard formats whose exact language we do not build: refuse rather than ignore
UNSUPPORTED_FORMATS = frozenset(
    {
        "duration",
        "idn-email",
        "idn-hostname",
        "iri",
        "iri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
        "regex",
    }
)

# the same languages over decoded values (what a string is, not how JSON spells it): they
# differ where a format's characters need escapes in JSON (a quoted local part's quotes)
FORMAT_VALUE_REGEXES: dict[str, str] = {
    **FORMAT_REGEXES,
    "email": _email(quoted=r'"([ !#-\[\]-~]|\\[ -~])*"'),
}
