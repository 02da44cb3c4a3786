"""Dates, times and durations (RFC 3339, its Appendix A for durations)."""

from __future__ import annotations

_YEAR = "[0-9]{4}"
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
DATE = (  # exact calendar dates, leap years included
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


TIME = (
    rf"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]{_SECFRAC}([Zz]|{_NUMOFFSET})"
    rf"|{_leap_seconds()})"
)

# RFC 3339 Appendix A, production by production: each unit is digits and its designator, the
# smaller units of a date or a time only after the larger one they follow (years, then
# months, then days; hours, then minutes, then seconds), weeks alone. The designators are
# upper case, as ISO 8601 writes them (RFC 5234 would let lower case through: left out).
_N = "[0-9]+"
_DUR_TIME = rf"T({_N}H({_N}M({_N}S)?)?|{_N}M({_N}S)?|{_N}S)"
_DUR_DATE = rf"({_N}D|{_N}M({_N}D)?|{_N}Y({_N}M({_N}D)?)?)({_DUR_TIME})?"
DURATION = rf"P({_DUR_DATE}|{_DUR_TIME}|{_N}W)"
