"""JSON Schema -> lark grammar, so recursive schemas (`$ref` cycles) compile exactly, with no
depth limit, through the CFG path: `compile_json_schema_cfg(schema, vocab)`.

The grammar generates the same compact text as `json_schema_to_regex` (properties in schema
order, `json.dumps(..., separators=(",", ":"), ensure_ascii=False)` spelling; `whitespace=True`
adds `%ignore` of JSON whitespace between tokens; a whitespace regex puts it where the regex
path does). `grammar.ebnf.lark_lower.json_schema_rules` gives the same language as rules
inside a larger grammar (a structural tag's `json_schema` content, a tool call's recursive
arguments). Objects, arrays, `$ref`, `anyOf` / `oneOf` become rules; scalar schemas (string /
number / integer / boolean / null / enum / const, with their bounds, patterns and formats)
become one terminal each, whose regex comes from `json_schema_to_regex` on that sub-schema.

Keywords: type (and lists), properties, required, additionalProperties (false, true or a
schema), items, prefixItems (fixed length), minItems / maxItems, $ref / $defs / definitions,
anyOf, oneOf (as anyOf when its branches are of different JSON types), allOf of one branch or of
scalar branches; annotations are ignored. Anything else raises UnsupportedSchemaError naming
the keyword and its JSON pointer.
"""

from __future__ import annotations

import json
from typing import Any

from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.json_schema.guidance import (
    ESCAPES_MARK,
    FLEXIBLE_WHITESPACE,
    SEPARATORS_MARK,
    read_x_guidance,
)
from grammar.json_schema.number_text import FLOAT64_NUMBER, PLAIN_INTEGERS_MARK
from grammar.json_schema.refs.local import local_refs, pointer_target
from grammar.json_schema.strict import apply_mode, check_mode
from grammar.json_schema.vocabulary import ANNOTATIONS, kind_of

# the keywords that annotate: `vocabulary.ANNOTATIONS`
STRUCTURAL = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "prefixItems",
     "minItems", "maxItems", "$ref", "anyOf", "oneOf", "allOf"}
)  # fmt: skip
SCALAR_TYPES = frozenset({"string", "number", "integer", "boolean", "null"})
MAX_BOUNDED_ITEMS = 64
STRING_CHAR = r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'

_ANY_VALUE = r"""
json_any: json_obj | json_arr | JSON_STRING | JSON_NUMBER | "true" | "false" | "null"
json_obj: {lb} [JSON_STRING {colon} json_any ({comma} JSON_STRING {colon} json_any)*] {rb}
json_arr: {ls} [json_any ({comma} json_any)*] {rs}
JSON_STRING: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u[0-9a-fA-F]{{4}})*"/
"""
_ANY_NUMBER = r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/"


def _lark_regex(regex: str) -> str:
    """A regex as a lark /.../ literal (slashes escaped)."""
    out, i = [], 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            out.append(regex[i : i + 2])
            i += 2
            continue
        out.append("\\/" if c == "/" else c)
        i += 1
    return "/" + "".join(out) + "/"


def _has_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "$ref" in schema or any(_has_ref(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_ref(v) for v in schema)
    return False


def _types_of(schema: Any) -> set[str] | None:
    """The JSON types a schema's instances can have, when it says (None: any / unknown)."""
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if isinstance(t, str):
        return {"number" if t == "integer" else t}
    if isinstance(t, list):
        return {"number" if x == "integer" else x for x in t}
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        return {"number" if kind_of(v) == "integer" else kind_of(v) for v in values}
    if "properties" in schema:
        return {"object"}
    if "items" in schema or "prefixItems" in schema:
        return {"array"}
    return None


class _Builder:
    def __init__(self, root: Any, mode: str = "exact", ws: str = "") -> None:
        self.root = root
        self.mode = mode  # "strict": closed objects, bounded numbers (json_schema_to_lark)
        self.ws = ws  # a regex of the white space around punctuation ("": compact)
        self.lines: list[str] = []
        self.by_ref: dict[str, str] = {}
        self.n_rules = 0
        self.n_terms = 0
        self.terminals: dict[str, str] = {}  # regex -> terminal name
        self.uses_any = False
        self.plain_integers = False  # integers without a zero fraction (PLAIN_INTEGERS_MARK)

    def new_rule(self) -> str:
        self.n_rules += 1
        return f"r{self.n_rules}"

    def terminal(self, regex: str) -> str:
        name = self.terminals.get(regex)
        if name is None:
            self.n_terms += 1
            name = self.terminals[regex] = f"T{self.n_terms}"
            self.lines.append(f"{name}: {_lark_regex(regex)}")
        return name

    def literal(self, text: str) -> str:
        return json.dumps(text)

    def punct(self, c: str) -> str:
        """A JSON punctuation character, with the white space the regex path puts around it
        (inside brackets, on both sides of `,` and `:`)."""
        if not self.ws:
            return json.dumps(c)
        ws = f"(?:{self.ws})"
        if c in "{[":
            return self.terminal("\\" + c + ws)
        if c in "}]":
            return self.terminal(ws + "\\" + c)
        return self.terminal(ws + c + ws)

    def any_value(self) -> str:
        """The rules of any JSON value (`json_any`), punctuated as the schema's values."""
        names = {"lb": "{", "rb": "}", "ls": "[", "rs": "]", "comma": ",", "colon": ":"}
        return _ANY_VALUE.format(**{k: self.punct(c) for k, c in names.items()})

    # ----- dispatch -----
    def rule(self, schema: Any, ptr: str) -> str:
        """A lark symbol (rule or terminal name) for the instances of `schema`."""
        if schema is True or schema == {}:
            self.uses_any = True
            return "json_any"
        if schema is False:
            raise GrammarError(f"the schema at {ptr} admits no instance")
        if not isinstance(schema, dict):
            raise GrammarError(f"schema at {ptr} is not an object or boolean")
        for key in schema:
            if key not in STRUCTURAL and key not in ANNOTATIONS and not self.scalar_keyword(key):
                raise UnsupportedSchemaError(key, f"{ptr}/{key}")
        if "$ref" in schema:
            others = [k for k in schema if k != "$ref" and k not in ANNOTATIONS]
            if others:
                raise UnsupportedSchemaError("$ref", ptr, f"beside {others}")
            return self.ref(schema["$ref"], ptr)
        if "allOf" in schema:
            return self.all_of(schema, ptr)
        for kind in ("anyOf", "oneOf"):
            if kind in schema:
                return self.any_of(schema, kind, ptr)
        types = schema.get("type")
        type_list = [types] if isinstance(types, str) else list(types or [])
        if "enum" in schema or "const" in schema or (type_list and set(type_list) <= SCALAR_TYPES):
            return self.scalar(schema, ptr)
        if not type_list:
            if "properties" in schema or "required" in schema or "additionalProperties" in schema:
                type_list = ["object"]
            elif "items" in schema or "prefixItems" in schema:
                type_list = ["array"]
            else:
                self.uses_any = True
                return "json_any"
        alts = []
        for t in type_list:
            if t == "object":
                alts.append(self.object(schema, ptr))
            elif t == "array":
                alts.append(self.array(schema, ptr))
            else:
                alts.append(self.scalar({**_scalar_part(schema), "type": t}, ptr))
        return self.alternatives(alts)

    @staticmethod
    def scalar_keyword(key: str) -> bool:
        return key in {
            "enum", "const", "minLength", "maxLength", "pattern", "format", "minimum",
            "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        }  # fmt: skip

    def alternatives(self, symbols: list[str]) -> str:
        symbols = list(dict.fromkeys(symbols))
        if len(symbols) == 1:
            return symbols[0]
        name = self.new_rule()
        self.lines.append(f"{name}: " + " | ".join(symbols))
        return name

    def ref(self, ref: str, ptr: str) -> str:
        if not ref.startswith("#") or (ref != "#" and not ref.startswith("#/")):
            raise UnsupportedSchemaError("$ref", ptr, f"only local references: {ref!r}")
        hit = self.by_ref.get(ref)
        if hit is not None:
            return hit
        try:
            node = pointer_target(self.root, ref)
        except LookupError:
            raise UnsupportedSchemaError("$ref", ptr, f"cannot resolve {ref!r}") from None
        # name the rule before building it, so a cycle refers back to it
        name = self.by_ref[ref] = self.new_rule()
        body = self.rule(node, ref)
        self.lines.append(f"{name}: {body}")
        return name

    def all_of(self, schema: dict, ptr: str) -> str:
        branches = schema["allOf"]
        rest = {k: v for k, v in schema.items() if k != "allOf" and k not in ANNOTATIONS}
        if len(branches) == 1 and not rest:
            return self.rule(branches[0], f"{ptr}/allOf/0")
        if not _has_ref(schema) and all(
            (_types_of(b) or {"x"}) <= SCALAR_TYPES for b in [*branches, rest] if b
        ):
            return self.scalar(schema, ptr)  # the regex path merges scalar allOf
        raise UnsupportedSchemaError("allOf", f"{ptr}/allOf", "only one branch or scalar branches")

    def any_of(self, schema: dict, kind: str, ptr: str) -> str:
        rest = {k: v for k, v in schema.items() if k != kind and k not in ANNOTATIONS}
        if rest:
            raise UnsupportedSchemaError(kind, ptr, f"beside {sorted(rest)}")
        branches = schema[kind]
        if kind == "oneOf":
            seen: set[str] = set()
            for i, b in enumerate(branches):
                types = _types_of(self.deref(b))
                if types is None or types & seen:
                    raise UnsupportedSchemaError(
                        "oneOf", f"{ptr}/oneOf/{i}", "branches may both match"
                    )
                seen |= types
        return self.alternatives(
            [self.rule(b, f"{ptr}/{kind}/{i}") for i, b in enumerate(branches)]
        )

    def deref(self, schema: Any) -> Any:
        for _ in range(32):
            if isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
                ref = schema["$ref"]
                node: Any = self.root
                for part in ref[1:].split("/")[1:] if ref != "#" else []:
                    node = node.get(part.replace("~1", "/").replace("~0", "~"), {})
                schema = node
            else:
                break
        return schema

    # ----- leaves -----
    def scalar(self, schema: dict, ptr: str) -> str:
        from grammar.json_schema.schema import json_schema_to_regex

        draft = self.root.get("$schema") if isinstance(self.root, dict) else None
        if isinstance(draft, str):  # the draft decides what an integer's spellings are
            schema = {**schema, "$schema": draft}
        if self.plain_integers:
            schema = {**schema, PLAIN_INTEGERS_MARK: True}
        schema = apply_mode(schema, self.mode)  # strict: bounded digits, I-JSON integers
        try:
            regex = json_schema_to_regex(schema)
        except UnsupportedSchemaError as e:
            raise UnsupportedSchemaError(e.keyword, ptr + e.pointer[1:], str(e)) from None
        return self.terminal(regex)

    # ----- objects -----
    def object(self, schema: dict, ptr: str) -> str:
        props: dict[str, Any] = dict(schema.get("properties", {}))
        required = list(dict.fromkeys(schema.get("required", [])))
        # strict mode: an object emits only the properties it declares
        extra = schema.get("additionalProperties", self.mode != "strict")
        for name in required:
            if name not in props:
                if extra is False:
                    raise GrammarError(f"the schema at {ptr} admits no instance")
                props[name] = extra
        members = []  # (symbol text of '"key":value', required)
        for name, sub in props.items():
            if any(ord(c) < 0x20 or c in '"\\' for c in name):
                raise UnsupportedSchemaError("properties", ptr, f"name {name!r} needs escapes")
            value = self.rule(sub, f"{ptr}/properties/{name}")
            key = self.literal(json.dumps(name, ensure_ascii=False))
            members.append((f"{key} {self.punct(':')} {value}", name in required))
        extra_member = None
        if extra is not False:
            key = self.terminal(_string_except(list(props)))
            value = self.rule(extra, f"{ptr}/additionalProperties")
            extra_member = f"{key} {self.punct(':')} {value}"
        # first[i]: members from i on, none written yet; after[i]: at least one written
        n, comma = len(members), self.punct(",")
        first = [self.new_rule() for _ in range(n + 1)]
        after = [self.new_rule() for _ in range(n + 1)]
        for i, (member, req) in enumerate(members):
            f_alts = [f"{member} {after[i + 1]}"]
            a_alts = [f"{comma} {member} {after[i + 1]}"]
            if not req:
                f_alts.append(first[i + 1])
                a_alts.append(after[i + 1])
            self.lines.append(f"{first[i]}: " + " | ".join(f_alts))
            self.lines.append(f"{after[i]}: " + " | ".join(a_alts))
        if extra_member is None:
            self.lines.append(f"{first[n]}: ")
            self.lines.append(f"{after[n]}: ")
        else:
            self.lines.append(f"{after[n]}: ({comma} {extra_member})*")
            self.lines.append(f"{first[n]}: [{extra_member} {after[n]}]")
        name = self.new_rule()
        self.lines.append(f"{name}: {self.punct('{')} {first[0]} {self.punct('}')}")
        return name

    # ----- arrays -----
    def array(self, schema: dict, ptr: str) -> str:
        if schema.get("uniqueItems"):
            raise UnsupportedSchemaError("uniqueItems", f"{ptr}/uniqueItems")
        lo = int(schema.get("minItems", 0))
        hi = schema.get("maxItems")
        name = self.new_rule()
        if "prefixItems" in schema:
            prefix = schema["prefixItems"]
            if schema.get("items", False) is not False or "minItems" in schema or hi is not None:
                raise UnsupportedSchemaError(
                    "prefixItems", f"{ptr}/prefixItems", "only with items: false"
                )
            elems = [self.rule(p, f"{ptr}/prefixItems/{i}") for i, p in enumerate(prefix)]
            body = f" {self.punct(',')} ".join(elems)
            self.lines.append(f"{name}: {self.punct('[')} {body} {self.punct(']')}")
            return name
        item = self.rule(schema.get("items", True), f"{ptr}/items")
        if hi is not None and int(hi) < lo:
            raise GrammarError(f"the schema at {ptr} admits no instance (maxItems < minItems)")
        if hi is not None and int(hi) > MAX_BOUNDED_ITEMS:
            hi = None if lo == 0 else hi
            if hi is not None:
                raise UnsupportedSchemaError("maxItems", f"{ptr}/maxItems", "too large")
        comma = self.punct(",")
        if hi is None:
            tail = f"({comma} {item})*"
        else:
            tail = ""
            for _ in range(int(hi) - max(lo, 1)):
                tail = f"({comma} {item} {tail})?"
        head = " ".join([item] + [f"{comma} {item}"] * (max(lo, 1) - 1))
        body = f"{head} {tail}".strip()
        if lo == 0:
            body = f"[{body}]" if hi != 0 else ""
        self.lines.append(f"{name}: {self.punct('[')} {body} {self.punct(']')}")
        return name


def _scalar_part(schema: dict) -> dict:
    return {k: v for k, v in schema.items() if _Builder.scalar_keyword(k) or k in ANNOTATIONS}


def _string_except(names: list[str]) -> str:
    """Regex of a JSON string (with quotes) whose raw content is none of `names` (the regex
    path's construction, written as text)."""
    from grammar.automata import regex_ast as ra
    from grammar.json_schema.objects import string_except

    if not names:
        return f'"{STRING_CHAR}*"'
    return ra.to_text(string_except(names, ra.parsed(STRING_CHAR), "#"))


def json_schema_to_lark(
    schema: Any, *, whitespace: bool | str = False, json_schema_mode: str = "exact"
) -> str:
    """A lark grammar (start rule `start`) of the compact serialisations of a schema's
    instances; `$ref` cycles become recursive rules. `json_schema_mode` as in
    `compile_json_schema`: "strict" closes each object that leaves `additionalProperties` unset
    to its declared properties, keeps integers without bounds within I-JSON's range and bounds
    a number's digits to a float64's (`number_text.FLOAT64_NUMBER`), in values of any type
    (`{}`) too. `whitespace`: True, JSON white space between any two tokens (`%ignore`); a
    regex, that white space where the regex path puts it (inside brackets, around `,` and
    `:`: `json_schema_to_regex(schema, whitespace)`'s language, a structural tag's
    `max_whitespace_cnt`)."""
    from grammar.json_schema.schema import load_schema

    default = whitespace if isinstance(whitespace, str) else ""
    if whitespace is True:
        default = FLEXIBLE_WHITESPACE
    loaded, ws = read_x_guidance(load_schema(schema), default)
    if isinstance(loaded, dict) and SEPARATORS_MARK in loaded:
        raise UnsupportedSchemaError(
            "x-guidance", "#/x-guidance", "custom separators with a recursive schema"
        )
    if isinstance(loaded, dict) and ESCAPES_MARK in loaded:
        raise UnsupportedSchemaError(
            "x-guidance", "#/x-guidance", "escape options with a recursive schema"
        )
    plain = isinstance(loaded, dict) and loaded.get(PLAIN_INTEGERS_MARK) is True
    if plain:
        loaded = {k: v for k, v in loaded.items() if k != PLAIN_INTEGERS_MARK}
    ignore = ws == FLEXIBLE_WHITESPACE and not isinstance(whitespace, str)
    root = local_refs(loaded)
    b = _Builder(root, check_mode(json_schema_mode), "" if ignore else ws or "")
    b.plain_integers = plain
    top = b.rule(root, "#")
    lines = [f"start: {top}", *b.lines]
    if b.uses_any:
        strict = json_schema_mode == "strict"
        number = _lark_regex(FLOAT64_NUMBER) if strict else _ANY_NUMBER
        lines.append(b.any_value() + f"JSON_NUMBER: {number}\n")
    if ignore:
        lines.append(r"%ignore /[ \t\n\r]+/")
    return "\n".join(lines) + "\n"


def compile_json_schema_cfg(
    schema: Any, vocab: Any, *, whitespace: bool = False, json_schema_mode: str = "exact"
) -> Any:
    """A constraint from a JSON Schema through the CFG path (exact for recursive schemas)."""
    from grammar.cfg.compiler import compile_lark

    text = json_schema_to_lark(schema, whitespace=whitespace, json_schema_mode=json_schema_mode)
    return compile_lark(text, vocab)
