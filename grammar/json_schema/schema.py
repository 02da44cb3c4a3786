"""JSON Schema (dict, JSON text or pydantic model class) -> regex over compact JSON text.

Output is what a schema-ordered generator emits: properties in the schema's order (own
`properties`, then each `allOf` branch's, then those of the chosen `anyOf` / `oneOf` branch, then
additional keys), `json.dumps(..., separators=(",", ":"), ensure_ascii=False)` spelling, and
`whitespace` (a regex, default none) between structural tokens.

A schema that admits no instance raises EmptyLanguageError (`compile_json_schema` makes it a
constraint that refuses every token). Recursive `$ref`s are unrolled `max_recursion_depth`
times (default 3): beyond that depth the recursive branch is impossible (an optional
recursive property is left out, a recursive array stays empty). Values of unconstrained
schemas (`{}` / `true`) are any JSON value nested at most `any_depth` levels deep (default 3
as regex text, ANY_DEPTH = 5 as automata). Keywords that cannot be honoured raise
UnsupportedSchemaError naming the keyword and its JSON pointer.
"""

from __future__ import annotations

import json
import re
from typing import Any

# imported with the module, not at a schema's first enum check: the library's import (about
# 50 ms, with attrs, idna and referencing) would otherwise land on that schema's compile time
import jsonschema

from grammar.automata import dfa_ops
from grammar.automata import regex_ast as ra
from grammar.automata.fsm import DEFAULT_MAX_STATES, node_to_dfa
from grammar.automata.pattern import losses, note_loss
from grammar.errors import EmptyLanguageError, GrammarError, UnsupportedSchemaError
from grammar.json_schema import arrays, number_text, objects, scalars
from grammar.json_schema import normalise as normal_form
from grammar.json_schema import oneof as json_oneof
from grammar.json_schema.exact.evaluated import split_refusal
from grammar.json_schema.exact.exclusive import oneof_by_negation
from grammar.json_schema.formats import FORMAT_REGEXES, FORMAT_VALUE_REGEXES
from grammar.json_schema.guidance import (
    ESCAPES_MARK,
    SEPARATORS_MARK,
    escape_policy_dfa,
    read_x_guidance,
)
from grammar.json_schema.literals import TRIE_MIN_VALUES, literals_node, single_spelling
from grammar.json_schema.merge import canonical, merge
from grammar.json_schema.number_text import FLOAT64_MARK, PLAIN_INTEGERS_MARK
from grammar.json_schema.objects import integral_as, literal
from grammar.json_schema.oneof import CANONICAL_TEXT, exactly_one_required, required_only
from grammar.json_schema.refs.local import local_refs
from grammar.json_schema.refs.reach import RefReach
from grammar.json_schema.scalars import STRING_CHAR_TEXT, STRING_TEXT, shared_leaf
from grammar.json_schema.vocabulary import ANNOTATIONS, kind_of, possible_types, type_set, values_of

MAX_ALTERNATIVES = 1024
ANY_DEPTH = 5  # nesting of unconstrained values in compiled constraints (automata)
# keywords that say nothing of a string, boolean or null but its type
_TYPE_ONLY = ANNOTATIONS | {"type"}

Node = object | None  # a regex node (grammar.automata.regex_ast); None matches nothing


def load_schema(schema: Any) -> dict | bool:
    """A schema as a dict (or bool) from a dict, JSON text, or pydantic model class."""
    if isinstance(schema, dict | bool):
        return schema
    if isinstance(schema, str | bytes):
        try:
            loaded = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"schema is not valid JSON: {e}") from None
        if not isinstance(loaded, dict | bool):
            raise GrammarError("a JSON Schema must be an object or a boolean")
        return loaded
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    raise GrammarError(f"cannot read a JSON Schema from {type(schema).__name__}")


def json_schema_to_regex(
    schema: Any,
    whitespace: str | None = None,
    *,
    max_recursion_depth: int = 3,
    any_depth: int = 3,
) -> str:
    """The regex of every compact serialisation of an instance (see module docstring)."""
    return ra.to_text(json_schema_to_node(schema, whitespace, max_recursion_depth, any_depth))


def json_schema_to_node(
    schema: Any,
    whitespace: str | None = None,
    max_recursion_depth: int = 3,
    any_depth: int = ANY_DEPTH,
) -> object:
    """Like json_schema_to_regex, as a shared regex syntax tree (what compile uses).
    Unconstrained values nest `ANY_DEPTH` (5) levels here, as automata; the regex text of
    json_schema_to_regex keeps 3 (that text grows 4-fold with each level)."""
    loaded, whitespace = read_x_guidance(load_schema(schema), whitespace)
    root = local_refs(loaded)
    builder = SchemaBuilder(root, whitespace or "", max_recursion_depth, any_depth)
    try:
        out = builder.value(root, "#")
    except GrammarError:
        raise
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, OverflowError) as e:
        # a keyword with a value of the wrong shape (e.g. "enum": 5, "maxLength": "x")
        raise GrammarError(f"malformed schema: {type(e).__name__}: {e}") from None
    except RecursionError:
        raise GrammarError("schema nests too deeply to compile") from None
    finally:  # its memos make cycles: emptied, what the result does not use is freed now,
        builder.__dict__.clear()  # not left for the next GC pass (~35k objects on Kubernetes)
    if out is None:
        raise EmptyLanguageError("the schema admits no instance")
    escapes = loaded.get(ESCAPES_MARK) if isinstance(loaded, dict) else None
    return out if escapes is None else _with_escapes(out, escapes)


_ESCAPES_MAX_STATES = 200_000


def _with_escapes(node: object, escapes: list) -> object:
    """`node`'s language with x-guidance's escape policy on its strings (a DFA product)."""
    where = "#/x-guidance/json_allowed_escapes"
    try:
        dfa = dfa_ops.product(
            node_to_dfa(node, _ESCAPES_MAX_STATES),
            escape_policy_dfa(*escapes),
            True,
            _ESCAPES_MAX_STATES,
        )
    except GrammarError as e:
        raise UnsupportedSchemaError(
            "x-guidance", where, f"the schema's automaton is too large for an escape option: {e}"
        ) from None
    if not dfa.accepting.any():
        raise EmptyLanguageError("the schema admits no instance with the allowed escapes")
    return dfa_ops.DFANode(dfa, "x-guidance", where)


def prebuild() -> None:
    """Build the shared automata no schema decides (any value at each depth, plain scalars,
    both integer spellings; ~40-80 ms once per process): `grammar.prebuild` calls this."""
    json_schema_to_node({"type": ["object", "string", "number", "boolean", "null"]})
    json_schema_to_node({"type": "integer"})
    json_schema_to_node({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"})


class SchemaBuilder:
    """One schema's compile: its settings and memos, and the recursion that turns a subschema
    into a regex node (`value` -> `normalise` -> `from_norm` -> `single` -> `typed`). The
    helpers of each kind of value (`scalars`, `arrays`, `objects`, `oneof`, `normalise`,
    `exact/`) are functions taking this builder as their first argument; `builder.Builder`
    lists what they may use of it."""

    def __init__(self, root: dict | bool, ws: str, max_depth: int, any_depth: int) -> None:
        self.root = root
        self.ws = ra.parsed(ws) if ws else ra.EMPTY
        self.ws_text = ws
        seps = root.get(SEPARATORS_MARK) if isinstance(root, dict) else None
        item, key = (ra.parsed(s) for s in seps) if seps else (ra.char(","), ra.char(":"))
        self.comma = ra.seq(self.ws, item, self.ws)
        self.colon = ra.seq(self.ws, key, self.ws)
        self.separators = tuple(seps or ())  # x-guidance's, else () for "," and ":"
        self.string_char = ra.parsed(STRING_CHAR_TEXT)
        self.any_string = shared_leaf(STRING_TEXT, "string")
        self.max_depth = max_depth
        self.any_depth = any_depth
        self.ref_stack: list[str] = []
        self.any_memo: dict[int, object] = {}
        self._finite: dict[int, tuple[Any, Node]] = {}  # id(schema) -> (schema, its node)
        self.string_memo: dict[tuple, tuple[Node, int]] = {}  # see scalars.string_value
        self.key_region_memo: dict[tuple, tuple[list, int]] = {}  # see objects.key_regions
        self._dfas: dict[tuple, tuple[object, Any]] = {}  # (id(node), budget) -> (node, DFA)
        self._values: dict[tuple, tuple] = {}  # see value
        self._accepted: dict[tuple, tuple[Any, bool]] = {}  # see accepts
        self.reach = RefReach(root)
        self.n_alternatives = 0
        self._validator: Any = None
        # id(merged branch) -> its automaton leaves strings out (see pattern.note_loss)
        self.lossy_nodes: dict[int, bool] = {}
        draft = str(root.get("$schema", "")) if isinstance(root, dict) else ""
        self.ref_overrides_siblings = any(f"draft-0{n}" in draft for n in (3, 4, 6, 7))
        # draft 6 on: a number with a zero fraction (1.0) is an integer
        self.integral_floats = not any(f"draft-0{n}" in draft for n in (3, 4))
        # strict mode marks its root: numbers carry at most a float64's digits
        self.float64_numbers = isinstance(root, dict) and root.get(FLOAT64_MARK) is True
        self.plain_integers = isinstance(root, dict) and root.get(PLAIN_INTEGERS_MARK) is True

    def dfa(self, node: object, max_states: int = DEFAULT_MAX_STATES) -> Any:
        """node_to_dfa(node, max_states), once per node object in a compile (the memoised
        pieces come back as the same node: a oneOf check or product meets them again)."""
        key = (id(node), max_states)
        hit = self._dfas.get(key)
        if hit is not None and hit[0] is node:
            return hit[1]
        dfa = node_to_dfa(node, max_states)
        self._dfas[key] = (node, dfa)  # holding the node keeps its id from being reused
        return dfa

    def wrap(self, open_: str, inner: Node, close: str) -> Node:
        """`inner` between two brackets, whitespace inside them."""
        return ra.seq(ra.char(open_), self.ws, inner, self.ws, ra.char(close))

    @property
    def number_text(self) -> str:
        """The regex of an unconstrained number: bounded digits in strict mode."""
        return number_text.FLOAT64_NUMBER if self.float64_numbers else number_text.NUMBER

    def normalise(self, schema: Any, ptr: str) -> dict | bool:
        """`normalise.normalise`: the schema as one conjunction of keywords."""
        return normal_form.normalise(self, schema, ptr)

    def resolve_ref(self, ref: str, ptr: str) -> Any:
        """`normalise.resolve_ref`: the schema a `$ref` names."""
        return normal_form.resolve_ref(self, ref, ptr)

    # ----- values -----
    def value(self, schema: Any, ptr: str) -> Node:
        values = self.finite_values(schema, ptr)
        if values is not None:
            # a pure function of the schema object (no recursion depth in it): a subschema
            # met again (each oneOf / presence case re-merges its parent) is built once
            hit = self._finite.get(id(schema))
            if hit is not None and hit[0] is schema:
                return hit[1]
            node = self._finite_value(schema, values, ptr)
            self._finite[id(schema)] = (schema, node)
            return node
        if not isinstance(schema, dict):
            return self.from_norm(self.normalise(schema, ptr), ptr)
        # a subschema's language depends on it and on how often each `$ref` it can reach is
        # being expanded (the recursion cut) only: built once per such context (narrowings
        # and alternatives it counted are counted again)
        depths: dict[str, int] = {}
        if self.ref_stack:
            reach = self.reach.of(schema)
            for r in self.ref_stack:
                if r in reach:
                    depths[r] = min(depths.get(r, 0) + 1, self.max_depth)
        key = (id(schema), tuple(sorted(depths.items())))
        hit = self._values.get(key)
        if hit is not None and hit[0] is schema:
            _, node, lost, alternatives = hit
            for _ in range(lost):
                note_loss()
            for _ in range(alternatives):
                self.count_alternative("anyOf", ptr)
            return node
        lost, alternatives = losses(), self.n_alternatives
        node = self.from_norm(self.normalise(schema, ptr), ptr)
        lost, alternatives = losses() - lost, self.n_alternatives - alternatives
        self._values[key] = (schema, node, lost, alternatives)
        return node

    def _finite_value(self, schema: Any, values: list, ptr: str) -> Node:
        """An enum / const somewhere in the conjunction: the instances are those of its
        values that the whole schema (every keyword, `not` / `if` included) accepts; the
        schema's own enum / const surely does (checking it is quadratic)."""
        check = schema
        if not ("$ref" in schema and self.ref_overrides_siblings) and values_of(schema):
            own = "const" if "const" in schema else "enum"
            check = {k: v for k, v in schema.items() if k != own}
        return self.literals(schema, values, ptr, check)

    def literals(self, schema: Any, values: list, ptr: str, check: Any = None) -> Node:
        """The alternation of the values' `literal_of`; many single-spelled values (a large
        string enum) as one trie automaton (`literals`), not that many alternatives."""
        if len(values) >= TRIE_MIN_VALUES and single_spelling(values):
            against = schema if check is None else check
            return literals_node([v for v in values if self.accepts(against, v)], ptr)
        return ra.alt([self.literal_of(schema, v, ptr, check) for v in values])

    def finite_values(self, schema: Any, ptr: str, depth: int = 0) -> list | None:
        """The values of an `enum` / `const` the schema is conjoined with (at its own level,
        through `$ref` or an `allOf` branch), or None."""
        if not isinstance(schema, dict) or depth > 8:
            return None
        if "$ref" in schema and self.ref_overrides_siblings:
            schema = {"$ref": schema["$ref"]}
        values = values_of(schema)
        if values is not None:
            return values
        if isinstance(schema.get("$ref"), str):
            target = self.resolve_ref(schema["$ref"], f"{ptr}/$ref")
            values = self.finite_values(target, schema["$ref"], depth + 1)
            if values is not None:
                return values
        for i, branch in enumerate(schema.get("allOf", [])):
            values = self.finite_values(branch, f"{ptr}/allOf/{i}", depth + 1)
            if values is not None:
                return values
        return None

    def literal_of(self, schema: Any, value: Any, ptr: str = "#", check: Any = None) -> Node:
        """The spellings of enum / const `value` that are instances of `schema`: its
        integral numbers as integers and / or with a fraction part, as the schema accepts
        them (draft 4: 2.0 is no integer); None if neither. Objects in any member order."""
        try:
            return self._literal_of(schema if check is None else check, value)
        except UnsupportedSchemaError as e:
            key = "const" if isinstance(schema, dict) and "const" in schema else "enum"
            raise UnsupportedSchemaError(key, f"{ptr}/{key}", str(e).split(": ", 1)[-1]) from None

    def _literal_of(self, schema: Any, value: Any) -> Node:
        ints, floats = integral_as(value, int), integral_as(value, float)
        as_int = self.accepts(schema, ints)
        punct = (self.ws, self.comma, self.colon)
        if repr(ints) == repr(floats):  # no integral number in it
            return literal(value, punct=punct) if as_int else None
        as_float = self.accepts(schema, floats)
        if as_int and as_float:
            return literal(value, punct=punct)
        if as_int or as_float:
            return literal(value, fractions=False if as_int else "only", punct=punct)
        return None

    def accepts(self, schema: Any, value: Any) -> bool:
        """Whether `value` is an instance of `schema` (a part of the root: its local `$ref`s
        resolve against the root), by the jsonschema library with formats asserted. Once
        per schema object and scalar value (oneOf checks ask again for every pair)."""
        if not isinstance(value, str | int | float | bool | None):
            return self._accepts(schema, value)
        key = (id(schema), type(value), value)
        hit = self._accepted.get(key)
        if hit is not None and hit[0] is schema:
            return hit[1]
        out = self._accepts(schema, value)
        self._accepted[key] = (schema, out)  # holding the schema keeps its id from reuse
        return out

    def _accepts(self, schema: Any, value: Any) -> bool:
        if self._validator is None:
            cls = jsonschema.validators.validator_for(self.root)
            root = self.root if isinstance(self.root, dict) else {}
            self._validator = cls(root, format_checker=cls.FORMAT_CHECKER)
        if schema.get("_fractional") and kind_of(value) == "integer":
            return False  # the `not` of integer that _fractional stands for
        clean = {k: v for k, v in schema.items() if not k.startswith("_")}
        if schema.get("_patterns"):  # merged allOf patterns: each must match
            clean["allOf"] = [{"pattern": p} for p in schema["_patterns"]]
        if set(clean) <= _TYPE_ONLY and isinstance(value, str | bool | None):
            # nothing to check but a type (enum values of strings, the common case: a
            # validator per value would be most of such a schema's compile time)
            kind = kind_of(value)
            t = clean.get("type", kind)
            return t == kind or (isinstance(t, list) and kind in t)
        fmt = clean.get("format")
        if isinstance(value, str) and fmt in FORMAT_REGEXES:
            # the library skips formats whose checker is not installed: ours decide
            if not re.fullmatch(FORMAT_VALUE_REGEXES[fmt], value):
                return False
        try:
            return bool(self._validator.evolve(schema=clean).is_valid(value))
        except Exception as e:  # an unresolvable reference, a malformed keyword
            raise UnsupportedSchemaError("enum", "#", f"cannot check a value: {e}") from None

    def from_norm(self, norm: dict | bool, ptr: str) -> Node:
        if norm is False:
            return None
        if norm is True:
            return scalars.any_value(self, self.any_depth)
        norm = dict(norm)
        refs = norm.pop("_refs", [])
        self.ref_stack.extend(refs)  # children of a referenced schema count as recursion
        try:
            alts = norm.pop("_alts", None)
            if not alts:
                return self.single(norm, ptr)
            # distribute the first alternative group; the rest stay in each merged branch
            (kind, branches, where), rest = alts[0], alts[1:]
            if rest:
                norm["_alts"] = rest
            if kind == "oneOf" and len(branches) > 1 and required_only(branches):
                kind, branches = "anyOf", exactly_one_required(branches, where)
            options: list[tuple[Node, Any, str]] = []
            for i, branch in enumerate(branches):
                self.count_alternative(kind, where)
                at = f"{where}/{i}"
                before = losses()
                try:
                    merged = merge(norm, self.normalise(branch, at), at)
                    node = self.from_norm(merged, at)
                except UnsupportedSchemaError as e:
                    renamed = split_refusal(e, where)  # in a made-up case: name the keyword
                    if renamed is None:
                        raise
                    raise renamed from None
                self.lossy_nodes[id(merged)] = losses() != before
                if kind == "oneOf" and node is None and self.lossy_nodes[id(merged)]:
                    # empty only as approximated: its instances must still be excluded
                    raise UnsupportedSchemaError(kind, at, "branch not exact (cannot exclude it)")
                options.append((node, merged, at))
            if kind == "oneOf":
                live = [o for o in options if o[0] is not None]
                try:
                    json_oneof.check_exclusive(self, live, where)
                except UnsupportedSchemaError as refusal:
                    split = json_oneof.split_oneof(self, [o[1] for o in live], where)
                    if split is None:  # exactly one branch: each, and not the others
                        return oneof_by_negation(self, norm, branches, where, refusal)
                    return split
            return ra.alt([o[0] for o in options])
        finally:
            del self.ref_stack[len(self.ref_stack) - len(refs) :]

    def count_alternative(self, kind: str, ptr: str) -> None:
        self.n_alternatives += 1
        if self.n_alternatives > MAX_ALTERNATIVES:
            raise UnsupportedSchemaError(kind, ptr, "too many alternatives")

    def types_of(self, s: dict, depth: int = 0) -> set[str]:
        """JSON types an instance of normalised `s` can have: its own keywords' types, within
        the union of each anyOf / oneOf group's branch types (all types past depth 3)."""
        types = possible_types(s)
        if depth > 3:
            return types
        for _, branches, where in s.get("_alts", []):
            union: set[str] = set()
            for i, branch in enumerate(branches):
                nb = self.normalise(branch, f"{where}/{i}")
                # False may only mean "past the recursion depth here": count it as any type
                union |= type_set({}) if isinstance(nb, bool) else self.types_of(nb, depth + 1)
            types &= union
        return types

    def single(self, s: dict, ptr: str) -> Node:
        values = None
        if "enum" in s:
            values = list(s["enum"])
        if "const" in s:
            c = s["const"]
            values = [c] if values is None else [v for v in values if canonical(v) == canonical(c)]
        excluded = {canonical(v): v for v in s.get("_not_values", [])}
        if values is not None:
            return self.literals(s, [v for v in values if canonical(v) not in excluded], ptr)
        types = s.get("type")
        if types is None:
            types = ["string", "number", "boolean", "null", "object", "array"]
        elif not isinstance(types, list):
            types = [types]
        if "number" in types and "integer" in types:
            types = [t for t in types if t != "integer"]
        return ra.alt([self.typed_except(t, s, list(excluded.values()), ptr) for t in types])

    def typed_except(self, t: str, s: dict, excluded: list, ptr: str) -> Node:
        """Values of type t, minus the `excluded` values (from `not` of an enum / const)."""
        node = self.typed(t, s, ptr)
        mine = [
            v for v in excluded if kind_of(v) == t or (t == "number" and kind_of(v) == "integer")
        ]
        if not mine or node is None:
            return node
        if t in ("boolean", "null"):
            return (
                ra.alt(
                    [
                        ra.lit(x)
                        for x in ("true", "false", "null")
                        if x not in map(_text, mine) and (t == "null") == (x == "null")
                    ]
                )
                if node is not None
                else None
            )
        if t in ("number", "integer"):
            # over exponent-free spellings, every one of which literal() lists for a value
            spelled = ra.parsed(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")
        elif t == "string":  # over canonical spellings: no other spelling of a value slips in
            spelled = ra.parsed(CANONICAL_TEXT)
        else:  # objects and arrays have many spellings
            raise UnsupportedSchemaError("not", ptr, f"of {t} enum values")
        dfa = dfa_ops.product(self.dfa(node), self.dfa(spelled), True)
        dfa = dfa_ops.product(dfa, node_to_dfa(ra.alt([literal(v) for v in mine])), False)
        return dfa_ops.DFANode(dfa, "not", ptr) if dfa.accepting.any() else None

    def typed(self, t: str, s: dict, ptr: str) -> Node:
        if t == "string":
            return scalars.string_value(self, s, ptr)
        if t in ("integer", "number") and any(k in s for k in scalars.DIGIT_KEYWORDS):
            node = self.typed(
                t, {k: v for k, v in s.items() if k not in scalars.DIGIT_KEYWORDS}, ptr
            )
            return scalars.with_digit_counts(self, node, t, s, ptr)
        if t == "integer":  # not an integer (`not` of integer) and an integer: none
            return None if s.get("_fractional") else scalars.integer_value(self, s, ptr)
        if t == "number":
            return scalars.number_value(self, s, ptr)
        if t == "boolean":
            return ra.alt([ra.lit("true"), ra.lit("false")])
        if t == "null":
            return ra.lit("null")
        if t == "object":
            return objects.object_value(self, s, ptr)
        if t == "array":
            return arrays.array_value(self, s, ptr)
        raise GrammarError(f"unknown type {t!r} at {ptr}/type")


def _text(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


# the types gen(dtype=...) takes, by the names that cross HTTP and the IR
DTYPE_NAMES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


def dtype_to_regex(dtype: type | str) -> str:
    """Regex for gen(dtype=...): int, float, bool (True|False), str (a JSON string); the type
    or its name (`DTYPE_NAMES`)."""
    known = (bool, "(True|False)"), (int, number_text.INTEGER), (float, number_text.NUMBER)
    t_of = DTYPE_NAMES.get(dtype) if isinstance(dtype, str) else dtype
    for t, regex in (*known, (str, STRING_TEXT)):
        if t_of is t:
            return regex
    raise GrammarError(f"unsupported dtype {dtype!r}: use int, float, bool or str")


__all__ = [
    "DTYPE_NAMES",
    "dtype_to_regex",
    "json_schema_to_node",
    "json_schema_to_regex",
    "load_schema",
]
