"""JSON Pointers (RFC 6901) and Relative JSON Pointers (draft-handrews-relative-json-pointer-01).

A pointer's reference tokens may hold any character, so as JSON string content the characters
JSON must escape (`"`, `\\`, controls) appear escaped: in any of their escape forms (`\\n` or
`\\u000a`, `\\"` or `\\u0022`); every other character is taken in its literal spelling, as for
the other formats (json.dumps writes them so).
"""

from __future__ import annotations

# the characters JSON must escape, each in every escape form
REQUIRED_ESCAPES = r'\\["\\bfnrt]|\\u00([01][0-9a-fA-F]|22|5[cC])'


def json_pointer(as_text: bool) -> str:
    """`*( "/" reference-token )`; a token's characters are any but `/` and `~`, or `~0` /
    `~1` (as JSON string content if `as_text`, else over the decoded value)."""
    unescaped = rf'([^"\\\x00-\x1f/~]|{REQUIRED_ESCAPES})' if as_text else "[^/~]"
    return rf"(/({unescaped}|~[01])*)*"


def relative_json_pointer(as_text: bool) -> str:
    """A non-negative integer without leading zeros, then `#` or a JSON pointer. The later
    draft (bhutton-00, cited by 2020-12) also allows `+n` / `-n` index manipulation before a
    pointer; those are left out, so every string taken is valid under both drafts."""
    return rf"(0|[1-9][0-9]*)(#|{json_pointer(as_text)})"
