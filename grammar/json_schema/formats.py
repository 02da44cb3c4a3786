"""Regexes for JSON Schema string formats (the text between the quotes).

Standard formats we cannot express exactly raise UnsupportedSchemaError; formats outside the
JSON Schema vocabulary (e.g. "int32", "color") are annotations and ignored, as the spec says.
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
_TIME = (
    r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?"
    r"([Zz]|[+\-]([01][0-9]|2[0-3]):[0-5][0-9])"
)
_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?"
_HOSTNAME = rf"{_LABEL}(\.{_LABEL})*"
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


FORMAT_REGEXES: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}[Tt]{_TIME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": rf"[a-zA-Z0-9.!#$%&'*+=?^_`{{|}}~\-]+@{_HOSTNAME}",
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
