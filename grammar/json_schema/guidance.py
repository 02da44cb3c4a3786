"""llguidance's `x-guidance` options on a JSON Schema (its docs/json_schema.md), each honoured
or refused by name: `read_x_guidance(schema)`.

Read at the top level only, as llguidance does (elsewhere the key is an unknown keyword, an
annotation). Honoured: `whitespace_flexible` (true: JSON white space, any amount, between
tokens; false: compact), `whitespace_pattern` (a regex matched at most once where white space
may be: bounds in it hold; it wins over `whitespace_flexible`), `coerce_one_of` (oneOf read as
anyOf), `item_separator` and `key_separator` (regexes, default "," and ":", written between
array items / members and between a key and its value, white space on either side as the
white-space options allow: recorded under the private root keyword `SEPARATORS_MARK`, which
the schema builder reads), `lenient` false, and the escape options: `json_allowed_escapes`
(the letters after `\\` a string may use, default `nrbtf\\"u`) and
`json_allow_general_unicode_escapes` (default false: `\\uXXXX` only for U+0000..U+001F; true:
for any character). Either one given, strings take exactly llguidance's escapes: the schema's
automaton intersected with `escape_policy_dfa` (recorded under `ESCAPES_MARK`; not with a
recursive schema). Without them our strings take every JSON escape. Everything else, and
those options with other values, raise UnsupportedSchemaError naming `x-guidance` and the
option's pointer.

Without a white-space option the caller's policy stands (compact for `compile_json_schema`;
llguidance's flexible default inside a lark `%json`).
"""

from __future__ import annotations

from typing import Any

from grammar.errors import GrammarError, UnsupportedSchemaError

FLEXIBLE_WHITESPACE = r"[ \t\n\r]*"
SEPARATORS_MARK = "_x_guidance_separators"  # [item regex, key regex] on a schema's root
ESCAPES_MARK = "_x_guidance_escapes"  # [allowed escape letters, general \\u] on a schema's root
_JSON_ESCAPES = frozenset('"\\/bfnrtu')
_DEFAULT_ESCAPES = 'nrbtf\\"u'  # llguidance's default json_allowed_escapes
_KNOWN = (
    "whitespace_flexible",
    "whitespace_pattern",
    "item_separator",
    "key_separator",
    "coerce_one_of",
    "lenient",
    "json_allowed_escapes",
    "json_allow_general_unicode_escapes",
)


_ESCAPE_LETTERS = "".join(sorted(_JSON_ESCAPES))


def _refuse(option: str, detail: str) -> UnsupportedSchemaError:
    return UnsupportedSchemaError("x-guidance", f"#/x-guidance/{option}", detail)


def _check_value(option: str, value: Any) -> None:
    """Refuse the options whose value asks for a language we do not generate."""
    if option in ("whitespace_flexible", "coerce_one_of", "lenient") and not isinstance(
        value, bool
    ):
        raise _refuse(option, "must be true or false")
    if option in ("item_separator", "key_separator"):
        _check_regex(option, value)
    if option == "lenient" and value:
        raise _refuse(option, "true (ignoring keywords that cannot be honoured) is not supported")
    if option == "json_allowed_escapes" and (
        not isinstance(value, str) or not frozenset(value) <= _JSON_ESCAPES
    ):
        raise _refuse(option, f"must be a string of JSON escape letters out of {_ESCAPE_LETTERS!r}")
    if option == "json_allow_general_unicode_escapes" and not isinstance(value, bool):
        raise _refuse(option, "must be true or false")


def _check_regex(option: str, pattern: Any) -> None:
    if not isinstance(pattern, str) or not pattern:
        raise _refuse(option, "must be a non-empty regex")
    from grammar.automata.nfa import parse_regex

    try:
        parse_regex(pattern)
    except GrammarError as e:
        raise _refuse(option, str(e)) from None


def _whitespace(options: dict, default: str | None) -> str | None:
    pattern = options.get("whitespace_pattern")
    if pattern is not None:
        _check_regex("whitespace_pattern", pattern)
        return f"(?:{pattern})?"
    if "whitespace_flexible" in options:
        return FLEXIBLE_WHITESPACE if options["whitespace_flexible"] else ""
    return default


def _one_of_as_any_of(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_one_of_as_any_of(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in ("const", "enum", "default", "examples"):
            out[k] = v
        else:
            out["anyOf" if k == "oneOf" and "anyOf" not in schema else k] = _one_of_as_any_of(v)
    return out


def read_x_guidance(schema: Any, default_whitespace: str | None = None) -> tuple[Any, str | None]:
    """(the schema without its top-level `x-guidance`, the white-space regex to compile it
    with: `default_whitespace` unless an option says otherwise)."""
    if not isinstance(schema, dict) or "x-guidance" not in schema:
        return schema, default_whitespace
    options = schema["x-guidance"]
    if not isinstance(options, dict):
        raise UnsupportedSchemaError("x-guidance", "#/x-guidance", "must be an object")
    for option, value in options.items():
        if option not in _KNOWN:
            raise _refuse(option, "unknown option")
        _check_value(option, value)
    rest = {k: v for k, v in schema.items() if k != "x-guidance"}
    if options.get("coerce_one_of"):
        rest = _one_of_as_any_of(rest)
    separators = [options.get("item_separator", ","), options.get("key_separator", ":")]
    if separators != [",", ":"]:
        rest[SEPARATORS_MARK] = separators
    escapes = _escapes(options)
    if escapes is not None:
        rest[ESCAPES_MARK] = escapes
    ws = _whitespace(options, default_whitespace)
    if escapes is not None:
        _check_quote_free(ws, separators)
    return rest, ws


def _escapes(options: dict) -> list | None:
    """[escape letters, general \\u] when an escape option narrows what our strings take
    (every JSON escape, `\\u` for any character), else None."""
    if not {"json_allowed_escapes", "json_allow_general_unicode_escapes"} & options.keys():
        return None
    letters = options.get("json_allowed_escapes", _DEFAULT_ESCAPES)
    general = options.get("json_allow_general_unicode_escapes", False)
    if frozenset(letters) == _JSON_ESCAPES and general:
        return None
    return ["".join(sorted(set(letters))), general]


def _check_quote_free(ws: str | None, separators: list) -> None:
    """The escape policy follows strings by their quotes: white space and separators that may
    hold a quote or a backslash would mislead it."""
    from grammar.automata.fsm import regex_to_dfa
    from grammar.automata.intersect import dfas_intersect

    quote = regex_to_dfa(r'[\s\S]*["\\][\s\S]*', 1000)
    for option, text in (
        ("whitespace_pattern", ws),
        ("item_separator", separators[0]),
        ("key_separator", separators[1]),
    ):
        if text and dfas_intersect(regex_to_dfa(text, 10_000), quote):
            raise _refuse(option, "may hold a quote or a backslash, with an escape option")


def escape_policy_dfa(letters: str, general: bool) -> Any:
    """A byte DFA over JSON text whose strings use only the escapes `letters` allow (`u`:
    `\\uXXXX`, for U+0000..U+001F unless `general`), following strings by their quotes:
    intersected with a schema's automaton it narrows exactly its strings' spellings."""
    from grammar.automata.dfa_ops import from_rows

    out, inside, esc, u1 = 1, 2, 3, 4  # row 0 dead; u1..u1+3: the four hex digits
    hexa = [ord(c) for c in "0123456789abcdefABCDEF"]
    rows = [[0] * 256 for _ in range(u1 + 4)]
    rows[out] = [out] * 256
    rows[out][ord('"')] = inside
    rows[out][ord("\\")] = 0
    rows[inside] = [inside] * 256
    rows[inside][ord('"')] = out
    rows[inside][ord("\\")] = esc
    for letter in letters:
        rows[esc][ord(letter)] = u1 if letter == "u" else inside
    for i in range(4):
        digits = hexa if general or i == 3 else [ord("0")] if i < 2 else [ord("0"), ord("1")]
        for byte in digits:
            rows[u1 + i][byte] = u1 + i + 1 if i < 3 else inside
    return from_rows(rows, [i == out for i in range(len(rows))])


def with_plain_integers(schema: Any) -> Any:
    """`schema` marked so that its integers are written plain (`1`, never `1.0`), as llguidance
    and XGrammar generate a lark grammar's `%json`; a boolean schema as it is."""
    from grammar.json_schema.number_text import PLAIN_INTEGERS_MARK

    return {**schema, PLAIN_INTEGERS_MARK: True} if isinstance(schema, dict) else schema


def schema_is_recursive(schema: Any) -> bool:
    """Whether some `$ref` of the schema can reach itself again."""
    from grammar.json_schema.refs.local import local_refs, pointer_target
    from grammar.json_schema.refs.reach import RefReach

    if not isinstance(schema, dict) or "$ref" not in str(schema):
        return False
    root = local_refs(schema)
    reach = RefReach(root)
    for ref in reach.of(root):
        try:
            target = pointer_target(root, ref)
        except (GrammarError, LookupError, ValueError, TypeError):
            continue  # refused where the schema is compiled
        if ref in reach.of(target):
            return True
    return False
