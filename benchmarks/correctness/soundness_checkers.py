r"""Checkers for the soundness benchmark where `jsonschema`'s own (or the packages it leans on)
are wrong or lax, written from the RFCs and ECMA-262:

- date: jsonschema (Python's `date.fromisoformat`) refuses the year 0000, RFC 3339 allows it.
- date-time / time: rfc3339-validator refuses every leap second; JSON Schema's reading
  (the suite's tests) allows `:60` exactly when the time is 23:59:60 in UTC.
- duration: isoduration reads ISO 8601 (fractions, weeks beside days); RFC 3339 appendix A.
- uri-template: the `uri-template` package refuses prefixes of 4 digits (`{a:1000}`) and
  percent-encoded variable names (`{%41}`), which RFC 6570 allows; literals also take the
  apostrophe of erratum 6937.
- uri / uri-reference / iri / iri-reference: rfc3987 reads IPvFuture's "v" as lower case
  only (`//[VC.x]`), while ABNF strings are case-insensitive (RFC 5234): the host is read with
  a lower-case "v" before the package's check.
- relative-json-pointer: jsonschema refuses a digit after any 0 (`70421`).
- pattern / patternProperties: jsonschema searches with Python's `re`, whose `\s`, `\d`,
  `\w`, `.` and `$` differ from ECMA-262's (`\s` lacks U+FEFF and has U+001C-1F and U+0085;
  `$` matches before a final newline) and which has no `\p{..}` (read here with the Unicode
  version of this Python's `unicodedata`, as the grammar reads it). `ecma_patterns()` makes
  jsonschema search with the `regex` package on a translation to ECMA meanings instead.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIME = re.compile(
    r"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)


def _leap_year(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def _date_ok(text: str) -> bool:
    m = _DATE.fullmatch(text)
    if not m:
        return False
    y, mo, d = (int(g) for g in m.groups())
    days = [31, 29 if _leap_year(y) else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    return 1 <= mo <= 12 and 1 <= d <= days[mo - 1]


def _time_ok(text: str) -> bool:
    m = _TIME.fullmatch(text)
    if not m:
        return False
    h, mi, s = int(m[1]), int(m[2]), int(m[3])
    oh, om = (int(m[6]), int(m[7])) if m[5] else (0, 0)
    if h > 23 or mi > 59 or s > 60 or oh > 23 or om > 59:
        return False
    if s < 60:
        return True
    sign = -1 if m[5] == "-" else 1
    utc = (h * 60 + mi - sign * (oh * 60 + om)) % 1440
    return utc == 23 * 60 + 59


def is_date_time(value: Any) -> bool:
    if not isinstance(value, str):
        return True
    parts = re.split("[Tt]", value)
    return len(parts) == 2 and _date_ok(parts[0]) and _time_ok(parts[1])


def is_date(value: Any) -> bool:
    return not isinstance(value, str) or _date_ok(value)


def is_time(value: Any) -> bool:
    return not isinstance(value, str) or _time_ok(value)


_D = "[0-9]+"
_DUR_TIME = f"T(?:{_D}H(?:{_D}M(?:{_D}S)?)?|{_D}M(?:{_D}S)?|{_D}S)"
_DUR_DATE = f"(?:{_D}D|{_D}M(?:{_D}D)?|{_D}Y(?:{_D}M(?:{_D}D)?)?)(?:{_DUR_TIME})?"
_DURATION = re.compile(f"P(?:{_DUR_DATE}|{_DUR_TIME}|{_D}W)")


def is_duration(value: Any) -> bool:
    return not isinstance(value, str) or _DURATION.fullmatch(value) is not None


_UCS = (
    "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"
    + "".join(f"{chr(p << 16)}-{chr((p << 16) + 0xFFFD)}" for p in range(1, 14))
    + "\U000e1000-\U000efffd"
)
_PRIVATE = "\ue000-\uf8ff\U000f0000-\U000ffffd\U00100000-\U0010fffd"
_PCT = "%[0-9A-Fa-f]{2}"
_ASCII_LITERAL = "\\x21\\x23\\x24\\x26\\x27\\x28-\\x3b\\x3d\\x3f-\\x5b\\x5d\\x5f\\x61-\\x7a\\x7e"
_LITERAL = f"(?:[{_ASCII_LITERAL}{_UCS}{_PRIVATE}]|{_PCT})"
_VARCHAR = f"(?:[A-Za-z0-9_]|{_PCT})"
_VARSPEC = f"{_VARCHAR}(?:\\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\\*)?"
_EXPRESSION = f"\\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\\}}"
_URI_TEMPLATE = re.compile(f"(?:{_LITERAL}|{_EXPRESSION})*")


def is_uri_template(value: Any) -> bool:
    return not isinstance(value, str) or _URI_TEMPLATE.fullmatch(value) is not None


_RJP = re.compile("(?:0|[1-9][0-9]*)(?:#|(?:/(?:[^~/]|~[01])*)*)", re.DOTALL)


def is_relative_json_pointer(value: Any) -> bool:
    return not isinstance(value, str) or _RJP.fullmatch(value) is not None


CHECKERS = {
    "relative-json-pointer": is_relative_json_pointer,
    "date": is_date,
    "date-time": is_date_time,
    "time": is_time,
    "duration": is_duration,
    "uri-template": is_uri_template,
}


_FUTURE_HOST = re.compile(r"(?<=[/@])\[V")


def _ip_future_any_case(check: Any) -> Any:
    def checked(value: Any) -> bool:
        return check(_FUTURE_HOST.sub("[v", value) if isinstance(value, str) else value)

    return checked


def format_checker(base: Any) -> Any:
    """`base` (a validator class's FORMAT_CHECKER) with the checkers above in place."""
    import jsonschema

    out = jsonschema.FormatChecker(formats=())
    out.checkers = dict(base.checkers)
    for name, fn in CHECKERS.items():
        out.checks(name)(fn)
    for name in ("uri", "uri-reference", "iri", "iri-reference"):
        if name in base.checkers:
            fn, raises = base.checkers[name]
            out.checks(name, raises)(_ip_future_any_case(fn))
    return out


_SPACE = "\\t\\n\\v\\f\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
_CLASS_BODY = {"d": "0-9", "w": "A-Za-z0-9_", "s": _SPACE}
_OUTSIDE = {
    **{k: f"[{v}]" for k, v in _CLASS_BODY.items()},
    **{k.upper(): f"[^{v}]" for k, v in _CLASS_BODY.items()},
    ".": "[^\\n\\r\\u2028\\u2029]",
    "$": "\\Z",
}


@functools.cache
def _unassigned() -> str:
    """A class body of the code points this Python's `unicodedata` has no character for (Cn):
    the grammar reads `\\p{..}` with this Unicode version, the `regex` package with its own
    (newer) one, so property escapes leave out what is unassigned here."""
    spans, start = [], None
    for cp in range(0x110001):
        cn = cp < 0x110000 and unicodedata.category(chr(cp)) == "Cn"
        if cn and start is None:
            start = cp
        elif not cn and start is not None:
            spans.append(f"\\U{start:08x}-\\U{cp - 1:08x}")
            start = None
    return "".join(spans)


def ecma_to_regex(pattern: str) -> tuple[str, int]:
    """An ECMA-262 pattern (no flags) as a `regex` pattern of the same meaning, and its flags:
    the class escapes and `.` spelled out, `$` only at the very end, `\\p{..}` / `\\P{..}` as
    this Python's Unicode version has them (set operations, so the V1 flag). Negated escapes
    inside a class (`[^\\S]`) are left as `regex` reads them (Unicode)."""
    out, i, in_class, flags = [], 0, False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            e = pattern[i + 1]
            prop = re.match(r"\\[pP]\{[^}]*\}", pattern[i:]) if e in "pP" else None
            if prop:
                op = "--" if e == "p" else ""  # \\p minus, \\P plus the unassigned
                out.append(f"[{prop[0]}{op}[{_unassigned()}]]")
                flags = regex_v1()
                i += len(prop[0])
                continue
            if in_class and e in _CLASS_BODY:
                out.append(_CLASS_BODY[e])
            elif not in_class and e in "dDwWsS":
                out.append(_OUTSIDE[e])
            else:
                out.append(c + e)
            i += 2
            continue
        if in_class:
            in_class = c != "]" or out[-1] in ("[", "[^")
        elif c == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
                continue
        elif c in ".$":
            c = _OUTSIDE[c]
        out.append(c)
        i += 1
    return "".join(out), flags


def regex_v1() -> int:
    import regex

    return regex.V1


class _EcmaRe:
    """Stands in for the `re` module inside jsonschema: `search` reads ECMA-262."""

    def __init__(self) -> None:
        self._compiled: dict[str, Any] = {}

    def search(self, pattern: str, string: str) -> Any:
        import regex

        if pattern not in self._compiled:
            text, flags = ecma_to_regex(pattern)
            self._compiled[pattern] = regex.compile(text, flags)
        return self._compiled[pattern].search(string)

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)


def ecma_patterns() -> None:
    """Make jsonschema's pattern keywords (pattern, patternProperties, additionalProperties
    and unevaluatedProperties beside them) search with ECMA-262 meanings, in this process."""
    from jsonschema import _keywords, _legacy_keywords, _utils

    shim = _EcmaRe()
    for module in (_keywords, _legacy_keywords, _utils):
        module.re = shim
