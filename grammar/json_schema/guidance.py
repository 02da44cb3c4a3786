"""llguidance's `x-guidance` options on a JSON Schema (its docs/json_schema.md), each honoured
or refused by name: `read_x_guidance(schema)`.

Read at the top level only, as llguidance does (elsewhere the key is an unknown keyword, an
annotation). Honoured: `whitespace_flexible` (true: JSON white space, any amount, between
tokens; false: compact), `whitespace_pattern` (a regex matched at most once where white space
may be: bounds in it hold; it wins over `whitespace_flexible`), `coerce_one_of` (oneOf read as
anyOf), `item_separator` and `key_separator` (regexes, default "," and ":", written between
array items / members and between a key and its value, white space on either side as the
white-space options allow: recorded under the private root keyword `SEPARATORS_MARK`, which
the schema builder reads), and the options whose value is the language we generate anyway:
`lenient` false,
`json_allowed_escapes` naming exactly the escapes our strings take (`"\\/bfnrtu`),
`json_allow_general_unicode_escapes` true (our strings take `\\uXXXX` for any character).
Everything else, and those options with other values, raise UnsupportedSchemaError naming
`x-guidance` and the option's pointer.

Without a white-space option the caller's policy stands (compact for `compile_json_schema`;
llguidance's flexible default inside a lark `%json`).
"""

from __future__ import annotations

from typing import Any

from grammar.errors import GrammarError, UnsupportedSchemaError

FLEXIBLE_WHITESPACE = r"[ \t\n\r]*"
SEPARATORS_MARK = "_x_guidance_separators"  # [item regex, key regex] on a schema's root
_OUR_ESCAPES = frozenset('"\\/bfnrtu')
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
        not isinstance(value, str) or frozenset(value) != _OUR_ESCAPES
    ):
        raise _refuse(option, f"only {''.join(sorted(_OUR_ESCAPES))!r} is supported")
    if option == "json_allow_general_unicode_escapes" and value is not True:
        raise _refuse(option, "strings always take \\uXXXX escapes here: only true is supported")


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
    return rest, _whitespace(options, default_whitespace)


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
