"""A structural tag's `json_schema` content in one of XGrammar's XML argument styles: the tool-call
arguments of Qwen3-Coder, MiniMax, DeepSeek V3.2, GLM-4.5, Kimi K3 and Cohere, as grammar
expressions.

The root schema is an object; each of its properties is one XML element, declared properties in
their order (a required one must appear, an optional one may be left out), white space
(`[ \\n\\t]*`, at most `max_whitespace_cnt` characters when given) before, between and after
them:

    qwen_xml      <parameter=KEY>VALUE</parameter>
    minimax_xml   <parameter name="KEY">VALUE</parameter>
    deepseek_xml  <｜DSML｜parameter name="KEY" string="true|false">VALUE</｜DSML｜parameter>
    glm_xml       <arg_key>KEY</arg_key> <arg_value>VALUE</arg_value>
    kimi_k3_xml   <|open|>argument key="KEY" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>

A string VALUE is raw text: any text without the element's closing string when the schema says
no more than `"type": "string"`, a full match of its `pattern`, `minLength`..`maxLength`
characters, or one of its `enum` / `const` values written raw. Every other VALUE is JSON (our
JSON-Schema semantics and whitespace policy, as for the `json` style), with white space around
it; `enum` / `const` values are written raw when strings and as compact JSON otherwise. A
property with no schema (`{}` / `true`) takes raw text or a JSON array or object. Kimi's TYPE
is the one the value is written with (`string`, `number` for integers too, `boolean`, `null`,
`array`, `object`); a schema that does not fix one allows each. Kimi escapes `&` and `"` in
keys as `&amp;` / `&quot;`.

A recursive value (a tree of nodes through `$defs`, or `"$ref": "#"`: the arguments object
itself as a JSON value) is exact at any depth where `json_leaf` gives the context-free path.
A root of `{}` / `true` takes any number of elements with keys `[a-zA-Z_][a-zA-Z0-9_]*`; extra
parameters beside declared ones (`additionalProperties`, `patternProperties`, `propertyNames`,
`minProperties` / `maxProperties`) are built by `grammar.structural.xml_extras`. What this does
not build is refused by name (`GrammarError` with the field's path): a string `format`, and a
property schema that may be a string or something else (`anyOf` / a type list with `string`).
`cohere_xml` (Cohere's nested, typed value tags) is built by `grammar.structural.xml_cohere`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grammar.automata.nfa import parse_regex
from grammar.ebnf.syntax import ANY_CHAR, Alt, Lit, Regular, Rep, Seq, free_text
from grammar.errors import GrammarError
from grammar.json_schema.schema import load_schema
from grammar.structural.xml_cohere import cohere_param
from grammar.structural.xml_extras import (
    EXTRA_KEYWORDS,
    MAX_OPTIONAL_COUNTED,
    ExtraKind,
    count_bounds,
    extra_kinds,
)


@dataclass(slots=True, frozen=True)
class XMLStyle:
    key_prefix: str
    key_suffix: str  # after the key; deepseek and kimi add attributes (`_key_suffix`)
    value_prefix: str
    closing: str


STYLES = {
    "qwen_xml": XMLStyle("<parameter=", ">", "", "</parameter>"),
    "minimax_xml": XMLStyle('<parameter name="', '">', "", "</parameter>"),
    "deepseek_xml": XMLStyle('<｜DSML｜parameter name="', "", "", "</｜DSML｜parameter>"),
    "glm_xml": XMLStyle("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    "kimi_k3_xml": XMLStyle('<|open|>argument key="', "", "", "<|close|>argument<|sep|>"),
    "cohere_xml": XMLStyle("<cofl:value", ">", "", "</cofl:value>"),
}
REFUSED_STYLES: tuple[str, ...] = ()
_KIMI_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
_ANNOTATIONS = {"title", "description", "examples", "default", "$comment", "deprecated"}
_ROOT_KEYS = _ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "$defs",
    "definitions",
    "$schema",
    "$id",
    *EXTRA_KEYWORDS,
}
_KEY_NAME = "[a-zA-Z_][a-zA-Z0-9_]*"

JsonLeaf = Callable[[Any, str], object]  # (schema, where) -> the JSON value's expression


@functools.lru_cache(maxsize=16)
def _white_space(max_whitespace: int | None) -> Regular:
    """The white space around parameters, parsed once per bound (~36 us a parse, once per tool
    before: ~2 ms of a 50-tool Qwen3-Coder tag's compile)."""
    ws = "[ \\n\\t]*" if max_whitespace is None else f"[ \\n\\t]{{0,{max_whitespace}}}"
    return Regular(parse_regex(ws), ("regex", ws))


class XMLArguments:
    """Builds the expression of one schema in one style; `json_leaf` gives JSON values."""

    def __init__(
        self, style: str, json_leaf: JsonLeaf, max_whitespace: int | None, where: str
    ) -> None:
        self.name = style
        self.style = STYLES[style]
        self.json_leaf = json_leaf
        self.where = where
        self.ws = _white_space(max_whitespace)
        self.defs: dict[str, Any] = {}
        self.whole: Any = {}
        self.cohere_refs: list[str] = []  # the $refs being written (cohere_xml)

    def refuse(self, what: str, at: str = "") -> GrammarError:
        return GrammarError(
            f"structural tag {self.where}.json_schema{at}: {what} is not supported with "
            f"style {self.name!r}"
        )

    def root(self, schema: Any) -> object:
        try:
            loaded = load_schema(schema)
        except GrammarError as e:
            raise GrammarError(f"structural tag {self.where}.json_schema: {e}") from None
        loaded = root_object(loaded)
        if (loaded is True or loaded == {}) and self.name == "cohere_xml":
            loaded = {"type": "object", "additionalProperties": True}
        if loaded is True or loaded == {}:
            return self._any_object()
        if loaded is False:
            return Alt(())
        for key in loaded:
            if key not in _ROOT_KEYS:
                raise self.refuse(f"the root keyword {key!r}")
        if loaded.get("type", "object") != "object":
            raise self.refuse(f"a root of type {loaded['type']!r} (the arguments are an object)")
        self.defs = {k: loaded[k] for k in ("$defs", "definitions") if k in loaded}
        self.whole = loaded  # what `"$ref": "#"` names
        return self.body(loaded, "")

    def body(self, loaded: dict, at: str) -> object:
        """The parameters of an object schema: declared ones in order, then the extras."""
        props = loaded.get("properties", {})
        required = set(loaded.get("required", []))
        missing = required - set(props)
        if missing:
            raise self.refuse(f"a required property with no schema ({sorted(missing)[0]!r})")
        here = f"structural tag {self.where}.json_schema{at}"
        kinds, barred = extra_kinds(loaded, list(props), self.strict, here)
        if barred & required:
            return Alt(())
        declared = [
            (Seq((self._element(key, sub, f"{at}/properties/{key}"), self.ws)), key in required)
            for key, sub in props.items()
            if key not in barred
        ]
        extras = Alt(tuple(Seq((self._extra(k), self.ws)) for k in kinds))
        lo, hi = count_bounds(loaded, here)
        if lo == 0 and hi is None:
            items: list[object] = [self.ws]
            items += [el if req else Rep(el, 0, 1) for el, req in declared]
            if kinds:
                items.append(Rep(extras, 0, None))
            return Seq(tuple(items))
        optional = sum(1 for _, req in declared if not req)
        if optional > MAX_OPTIONAL_COUNTED:
            raise self.refuse(
                f"minProperties / maxProperties with over {MAX_OPTIONAL_COUNTED} optional "
                "properties", f"{at}/maxProperties" if hi is not None else f"{at}/minProperties",
            )  # fmt: skip
        return Seq((self.ws, _counted(declared, extras if kinds else None, lo, hi)))

    def _extra(self, kind: ExtraKind) -> object:
        if self.name == "cohere_xml":
            name = Seq((Lit(' name="'), kind.name, Lit('"')))
            return cohere_param(self, name, kind.schema, kind.at)
        sub = self._resolved(kind.schema, kind.at)
        kimi_type = _kimi_type(sub) if self.name == "kimi_k3_xml" else None
        return Seq(
            (
                Lit(self.style.key_prefix),
                kind.name,
                self._key_suffix(kimi_type),
                *self._value_prefix(),
                self._value(sub, kind.at),
                Lit(self.style.closing),
            )
        )

    strict = True  # set by the caller from the reader's mode

    def _any_object(self) -> object:
        s = self.style
        key = Regular(parse_regex(_KEY_NAME), ("regex", _KEY_NAME))
        element = Seq(
            (
                Lit(s.key_prefix),
                key,
                self._key_suffix(None),
                *self._value_prefix(),
                self._any_value(),
                Lit(s.closing),
            )
        )
        return Seq((self.ws, Rep(Seq((element, self.ws)), 0, None)))

    def _key_suffix(self, kimi_type: str | None) -> object:
        if self.name == "deepseek_xml":
            return Alt((Lit('" string="true">'), Lit('" string="false">')))
        if self.name == "kimi_k3_xml":
            names = (kimi_type,) if kimi_type else _KIMI_TYPES
            return Alt(tuple(Lit(f'" type="{t}"<|sep|>') for t in names))
        return Lit(self.style.key_suffix)

    def _value_prefix(self) -> tuple[object, ...]:
        return (self.ws, Lit(self.style.value_prefix)) if self.style.value_prefix else ()

    def _raw_text(self) -> object:
        return free_text([self.style.closing], f"{self.where}.json_schema")

    def _any_value(self) -> object:
        return Alt(
            (
                self._raw_text(),
                Seq((self.ws, self.json_leaf({"type": "array"}, self.where), self.ws)),
                Seq((self.ws, self.json_leaf({"type": "object"}, self.where), self.ws)),
            )
        )

    def _element(self, key: str, sub: Any, at: str) -> object:
        if self.name == "cohere_xml":
            return cohere_param(self, Lit(f' name="{key}"'), sub, at)
        sub = self._resolved(sub, at)
        kimi_type = _kimi_type(sub) if self.name == "kimi_k3_xml" else None
        if self.name == "kimi_k3_xml":
            key = key.replace("&", "&amp;").replace('"', "&quot;")
        return Seq(
            (
                Lit(self.style.key_prefix + key),
                self._key_suffix(kimi_type),
                *self._value_prefix(),
                self._value(sub, at),
                Lit(self.style.closing),
            )
        )

    def _resolved(self, sub: Any, at: str) -> Any:
        if isinstance(sub, dict) and "$ref" in sub:
            ref = sub["$ref"]
            if ref == "#" and len(sub) == 1:  # the arguments themselves, as a JSON value
                return self.whole
            for base in ("$defs", "definitions"):
                prefix = f"#/{base}/"
                if isinstance(ref, str) and ref.startswith(prefix):
                    target = self.defs.get(base, {}).get(ref[len(prefix) :])
                    if target is not None and len(sub) == 1:
                        return self._resolved(target, at)
            raise self.refuse(f"$ref {ref!r} beside other keywords or outside $defs", at)
        return sub

    def _value(self, sub: Any, at: str) -> object:
        if sub is True or sub == {} or (isinstance(sub, dict) and set(sub) <= _ANNOTATIONS):
            return self._any_value()
        if sub is False:
            return Alt(())
        values = _listed_values(sub)
        if values is not None:
            lits = tuple(Lit(v if isinstance(v, str) else _compact(v)) for v in values)
            return Seq((self.ws, Alt(lits), self.ws))
        types = sub.get("type")
        if (isinstance(types, list) and "string" in types) or (
            types is None and any(k in sub for k in ("anyOf", "oneOf", "allOf"))
        ):
            raise self.refuse("a value that may be a string or something else", at)
        if types == "string":
            return self._string(sub, at)
        with_defs = {**sub, **self.defs} if self.defs else sub
        return Seq((self.ws, self.json_leaf(with_defs, f"{self.where}.json_schema{at}"), self.ws))

    def _string(self, sub: dict, at: str) -> object:
        if "format" in sub:
            raise self.refuse("a string format", f"{at}/format")
        if "pattern" in sub:
            if "minLength" in sub or "maxLength" in sub:
                raise self.refuse("pattern with minLength / maxLength", at)
            try:
                node = parse_regex(sub["pattern"])
            except GrammarError as e:
                raise GrammarError(f"structural tag {self.where}.json_schema{at}: {e}") from None
            return Seq((self.ws, Regular(node, ("regex", sub["pattern"])), self.ws))
        lo, hi = sub.get("minLength", 0), sub.get("maxLength")
        if lo or hi is not None:
            return Seq((self.ws, Rep(ANY_CHAR, int(lo), None if hi is None else int(hi)), self.ws))
        return self._raw_text()


def _counted(
    declared: list[tuple[object, bool]], extras: object | None, lo: int, hi: int | None
) -> object:
    """The declared elements (each with whether it is required) then the extras, holding
    `lo`..`hi` parameters in all; one shared node per (position, count so far)."""
    memo: dict[tuple[int, int], object] = {}

    def rest(i: int, n: int) -> object:
        if hi is not None and n > hi:
            return Alt(())
        if (i, n) in memo:
            return memo[(i, n)]
        if i == len(declared):
            if extras is None:
                out: object = Seq(()) if n >= lo else Alt(())
            else:
                out = Rep(extras, max(0, lo - n), None if hi is None else hi - n)
        else:
            element, required = declared[i]
            taken = Seq((element, rest(i + 1, n + 1)))
            out = taken if required else Alt((taken, rest(i + 1, n)))
        memo[(i, n)] = out
        return out

    return rest(0, 0)


def root_object(schema: Any) -> Any:
    """A root that is only a `$ref` into its own `$defs` / `definitions` (pydantic's way of
    writing a recursive model) as the definition it names, the definitions kept beside it
    (the same language: the definition's `#/$defs/...` refs resolve as before, and `#` now
    names the definition, which the root was)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("$ref"), str):
        return schema
    defs = {k: schema[k] for k in ("$defs", "definitions") if isinstance(schema.get(k), dict)}
    rest = set(schema) - set(defs) - {"$ref", "$schema", "$id"} - _ANNOTATIONS
    ref = schema["$ref"]
    for base, table in defs.items():
        prefix = f"#/{base}/"
        target = table.get(ref[len(prefix) :]) if ref.startswith(prefix) else None
        if isinstance(target, dict) and not rest and "$ref" not in target:
            keep = {k: schema[k] for k in ("$schema", "$id") if k in schema}
            return {**keep, **target, **defs}
    return schema


def _listed_values(sub: Any) -> list[Any] | None:
    if not isinstance(sub, dict):
        return None
    if "const" in sub:
        return [sub["const"]]
    if "enum" in sub and isinstance(sub["enum"], list):
        return list(sub["enum"])
    return None


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _json_type(value: Any) -> str:
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return "array" if isinstance(value, list) else "object"


def _kimi_type(sub: Any) -> str | None:
    """The one type attribute a Kimi K3 value of `sub` is written with, or None."""
    values = _listed_values(sub)
    if values is not None:
        kinds = {_json_type(v) for v in values}
        return kinds.pop() if len(kinds) == 1 else None
    t = sub.get("type") if isinstance(sub, dict) else None
    if t in ("integer", "number"):
        return "number"
    return t if isinstance(t, str) else None
