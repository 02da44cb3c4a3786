"""Host names, IP addresses and e-mail addresses (RFC 1123, 4291, 5321)."""

from __future__ import annotations

OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"  # no leading zeros
IPV4 = rf"({OCTET}\.){{3}}{OCTET}"
_H16 = "[0-9A-Fa-f]{1,4}"
_A = "[a-zA-Z0-9]"
_X = "[a-zA-Z0-9\\-]"


def _label(n: int | None) -> str:
    """An LDH label of 1..n characters (any number if None; no leading / trailing hyphen)
    without hyphens in both its 3rd and 4th places: those are reserved (RFC 5891: "xn--"
    A-labels, whose punycode and IDNA rules are not checked here, so they are left out)."""
    middle = "*" if n is None else f"{{0,{n - 5}}}"
    return rf"{_A}({_A}|{_X}{_A}|{_X}{{2}}{_A}|{_X}({_A}{_X}|\-{_A}){_X}{middle}{_A})?"


def labels(n: int | None) -> str:
    """Dot-separated labels of at most n characters each (any number if None)."""
    return rf"{_label(n)}(\.{_label(n)})*"


# labels of at most 63 characters and at most 253 in all (RFC 1123): by the number of
# labels, so that the total holds without counting (up to 3 of 63, 4 of 62, 8 of 30, 16 of
# 14; longer names are left out). Under a maxLength the total is counted instead (formats).
_HOST_SHAPES = ((63, 0, 2), (62, 3, 3), (30, 4, 7), (14, 8, 15))
HOSTNAME = (
    "(" + "|".join(rf"{_label(n)}(\.{_label(n)}){{{lo},{hi}}}" for n, lo, hi in _HOST_SHAPES) + ")"
)


def ipv6() -> str:
    """RFC 4291 text forms: eight groups, "::" for one or more zero groups, and an IPv4 tail
    in place of the last two groups (what Python's ipaddress accepts, no zone id; the same
    language as RFC 3986's IPv6address)."""

    def groups(n: int) -> str:  # n groups joined by ":"
        return "" if n == 0 else rf"{_H16}(:{_H16}){{{n - 1}}}"

    forms = [rf"({_H16}:){{7}}{_H16}", rf"({_H16}:){{6}}{IPV4}"]
    for left in range(8):
        for right in range(8 - left):  # "::" stands for at least one group
            if left + right <= 7:
                forms.append(f"{groups(left)}::{groups(right)}")
            if left + right <= 5:
                tail = f"{groups(right)}:" if right else ""
                forms.append(f"{groups(left)}::{tail}{IPV4}")
    return "(" + "|".join(forms) + ")"


def email(quoted: str, literals: bool = True) -> str:
    """RFC 5321 mailboxes: a dot-atom local part (RFC 5322 atext runs joined by single dots)
    or a quoted string (`quoted`: as JSON string content, or as the decoded value), "@",
    then a domain (host name labels, their lengths not counted: an e-mail's maxLength
    then stays a small product) or an address literal ([IPv4] or [IPv6:...])."""
    atom = r"[a-zA-Z0-9!#$%&'*+/=?^_`{|}~\-]+"
    literal = rf"|\[{IPV4}\]|\[IPv6:{ipv6()}\]" if literals else ""
    return rf"({atom}(\.{atom})*|{quoted})@({labels(None)}{literal})"


QUOTED_TEXT = r'\\"([ !#-\[\]-~]|\\\\([ !#-\[\]-~]|\\\\|\\"))*\\"'  # as JSON string content
QUOTED_VALUE = r'"([ !#-\[\]-~]|\\[ -~])*"'  # the same, decoded
