"""JSON Schema (dict, JSON text or pydantic model class) -> regex over compact JSON text.

Output is what a schema-ordered generator emits: properties in the schema's order (own
`properties`, then each `allOf` branch's, then those of the chosen `anyOf` / `oneOf` branch, then
additional keys), `json.dumps(..., separators=(",", ":"), ensure_ascii=False)` spelling, and
`whitespace` (a regex, default none) between structural tokens.

Recursive `$ref`s are unrolled `max_recursion_depth` times (default 3): beyond that depth the
recursive branch is impossible (an optional recursive property is left out, a recursive array
stays empty). Values of unconstrained schemas (`{}` / `true`) are any JSON value nested at most
`any_depth` levels deep (default 3). Keywords that cannot be honoured raise
UnsupportedSchemaError naming the keyword and its JSON pointer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from grammar import dfa_ops, json_oneof, numbers
from grammar import regex_ast as ra
from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.formats import FORMAT_REGEXES, UNSUPPORTED_FORMATS
from grammar.fsm import node_to_dfa
from grammar.json_objects import (
    DEPENDENCY_KEYS,
    ObjectRules,
    integral_as,
    literal,
    name_lists,
    ptr_escape,
)
from grammar.json_oneof import (
    CANONICAL_TEXT,
    OneOfRules,
    exactly_one_required,
    kind_of,
    possible_types,
    required_only,
    values_of,
)
from grammar.pattern import losses, note_loss, pattern_to_content
from grammar.schema_merge import (
    ASSERTIONS,
    UNSUPPORTED,
    canonical,
    merge,
    type_set,
)

# one decoded character: a literal one, a short escape, a \uXXXX escape that is no surrogate,
# or an escaped surrogate pair (one character, as JSON Schema lengths count it)
STRING_CHAR_TEXT = (
    r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u([0-9a-cA-CefEF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})'
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
)
STRING_TEXT = f'"{STRING_CHAR_TEXT}*"'
MAX_ALTERNATIVES = 1024

Node = object | None  # a regex node (grammar.regex_ast); None matches nothing


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
    schema: Any, whitespace: str | None = None, max_recursion_depth: int = 3, any_depth: int = 3
) -> object:
    """Like json_schema_to_regex, as a shared regex syntax tree (what compile uses)."""
    root = load_schema(schema)
    try:
        out = _Builder(root, whitespace or "", max_recursion_depth, any_depth).value(root, "#")
    except GrammarError:
        raise
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, OverflowError) as e:
        # a keyword with a value of the wrong shape (e.g. "enum": 5, "maxLength": "x")
        raise GrammarError(f"malformed schema: {type(e).__name__}: {e}") from None
    except RecursionError:
        raise GrammarError("schema nests too deeply to compile") from None
    if out is None:
        raise GrammarError("the schema admits no instance")
    return out


class _Builder(ObjectRules, OneOfRules):
    def __init__(self, root: dict | bool, ws: str, max_depth: int, any_depth: int) -> None:
        self.root = root
        self.ws = ra.parsed(ws) if ws else ra.EMPTY
        self.ws_text = ws
        self.comma = ra.seq(self.ws, ra.char(","), self.ws)
        self.colon = ra.seq(self.ws, ra.char(":"), self.ws)
        self.string_char = ra.parsed(STRING_CHAR_TEXT)
        self.any_string = _leaf(STRING_TEXT, "string")
        self.max_depth = max_depth
        self.any_depth = any_depth
        self.ref_stack: list[str] = []
        self._any: dict[int, object] = {}
        self.n_alternatives = 0
        self._validator: Any = None
        # id(merged branch) -> its automaton leaves strings out (see pattern.note_loss)
        self.lossy_nodes: dict[int, bool] = {}
        draft = str(root.get("$schema", "")) if isinstance(root, dict) else ""
        self.ref_overrides_siblings = any(f"draft-0{n}" in draft for n in (3, 4, 6, 7))

    # ----- normalisation: $ref, allOf, anyOf/oneOf groups -----
    def resolve_ref(self, ref: str, ptr: str) -> Any:
        if not ref.startswith("#"):
            raise UnsupportedSchemaError("$ref", ptr, f"only local references: {ref!r}")
        node: Any = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            part = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), part)
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise UnsupportedSchemaError("$ref", ptr, f"cannot resolve {ref!r}")
        return node

    def normalise(self, schema: Any, ptr: str) -> dict | bool:
        """Flatten $ref and allOf; returns False when the recursion budget is exhausted."""
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, dict):
            raise GrammarError(f"schema at {ptr} is not an object or boolean")
        if "$ref" in schema and self.ref_overrides_siblings:
            schema = {"$ref": schema["$ref"]}  # draft 4..7: keywords beside $ref are ignored
        if "not" in schema and schema["not"] in (True, False, {}):
            if schema["not"] is not False:
                return False  # not {} / not true: nothing is valid
            schema = {k: v for k, v in schema.items() if k != "not"}
        negated = None
        if "not" in schema:  # as an anyOf of the ways to violate it
            negated = ("anyOf", self.violations(schema["not"], f"{ptr}/not"), f"{ptr}/not")
            if not negated[1]:
                return False
            schema = {k: v for k, v in schema.items() if k != "not"}
        schema = _integral_counts(schema, ptr)
        schema, dependent = _dependent_schemas(schema)
        conditional = None
        if "if" in schema and ("then" in schema or "else" in schema):
            # (if and then) or (not if and else): an anyOf of two schemas
            cond, then, other = schema["if"], schema.get("then", True), schema.get("else", True)
            branches = [{"allOf": [cond, then]}, {"allOf": [{"not": cond}, other]}]
            conditional = ("anyOf", branches, f"{ptr}/if")
        if "if" in schema or "then" in schema or "else" in schema:  # then / else alone: ignored
            schema = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
        for key in UNSUPPORTED:
            if key in schema and not (key in DEPENDENCY_KEYS and name_lists(schema[key])):
                raise UnsupportedSchemaError(key, f"{ptr}/{key}")
        out: dict | bool = {
            k: v for k, v in schema.items() if k not in ("$ref", "allOf", "anyOf", "oneOf")
        }
        alts = []
        for kind in ("anyOf", "oneOf"):
            if kind in schema:
                branches = schema[kind]
                if not isinstance(branches, list) or not branches:
                    raise GrammarError(f"{kind} at {ptr} must be a non-empty list")
                alts.append((kind, branches, f"{ptr}/{kind}"))
        if negated and len(negated[1]) > 1:
            alts.append(negated)
        if conditional:
            alts.append(conditional)
        if alts:
            out["_alts"] = alts
        if "$ref" in schema:
            ref = schema["$ref"]
            if self.ref_stack.count(ref) >= self.max_depth:
                note_loss()  # the recursion cut: deeper instances are left out
                return False
            self.ref_stack.append(ref)
            try:
                target = self.normalise(self.resolve_ref(ref, f"{ptr}/$ref"), ref)
            finally:
                self.ref_stack.pop()
            out = merge(target, out, f"{ptr}/$ref")
            if isinstance(out, dict):
                out["_refs"] = [*out.get("_refs", []), ref]
        for i, branch in enumerate(schema.get("allOf", [])):
            out = merge(out, self.normalise(branch, f"{ptr}/allOf/{i}"), f"{ptr}/allOf/{i}")
        for at, name, sub in dependent:  # if the name is present, the schema applies
            cond = self.normalise({"if": {"required": [name]}, "then": sub}, f"{ptr}/{at}")
            out = merge(out, cond, f"{ptr}/{at}")
        if negated and len(negated[1]) == 1:  # one way to violate it: a plain conjunction
            out = merge(out, self.normalise(negated[1][0], negated[2]), negated[2])
        return out

    def violations(self, schema: Any, ptr: str) -> list:
        """Schemas whose union is exactly the instances that fail `schema` (for `not`): one
        per keyword of the conjunction, each the instances that keyword rejects. Keywords
        whose failures we cannot describe raise UnsupportedSchemaError naming `not`."""
        before = losses()
        n = self.normalise(schema, ptr)
        if n is False and losses() != before:
            raise UnsupportedSchemaError("not", ptr, "of a schema cut at the recursion depth")
        if n is True or n is False:
            return [True] if n is False else []
        if "_alts" in n:
            raise UnsupportedSchemaError("not", ptr, "of anyOf / oneOf")
        out: list[Any] = []
        for key, v in n.items():
            if key not in ASSERTIONS:
                continue  # annotations and unknown keywords
            if key == "type":
                types = type_set(n)
                if "integer" in types and "number" not in types:
                    raise UnsupportedSchemaError("not", ptr, "of integer (non-integer numbers)")
                rest = [t for t in _ALL_TYPES if t not in types]
                if rest:
                    out.append({"type": rest})
            elif key == "required":
                out += [{"type": "object", "properties": {name: False}} for name in v]
            elif key in _COUNT_KEYS and isinstance(v, int) and not isinstance(v, bool):
                kind, other = _COUNT_KEYS[key]
                if key.startswith("max"):
                    out.append({"type": kind, other: v + 1})
                elif v > 0:
                    out.append({"type": kind, other: v - 1})
            elif key == "propertyNames" and v is False:
                out.append({"type": "object", "minProperties": 1})
            elif key == "properties":
                for name, sub in v.items():
                    if sub is False:
                        out.append({"type": "object", "required": [name]})
                    elif sub is not True and sub != {}:
                        out.append(
                            {
                                "type": "object",
                                "required": [name],
                                "properties": {name: {"not": sub}},
                            }
                        )
            elif key in ("enum", "const"):
                values = [v] if key == "const" else list(v)
                if "const" in n and "enum" in n and key == "enum":
                    continue  # merged already into one list
                out.append({"_not_values": [x for x in values if self.accepts(n, x)]})
            elif key == "additionalProperties" and v in (True, {}):
                continue
            else:
                raise UnsupportedSchemaError("not", ptr, f"cannot negate {key!r}")
        return out

    # ----- values -----
    def value(self, schema: Any, ptr: str) -> Node:
        values = self.finite_values(schema, ptr)
        if values is not None:
            # an enum / const somewhere in the conjunction: the instances are those of its
            # values that the whole schema (every keyword, `not` / `if` included) accepts
            return ra.alt([self.literal_of(schema, v) for v in values])
        return self.from_norm(self.normalise(schema, ptr), ptr)

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

    def literal_of(self, schema: Any, value: Any) -> Node:
        """The spellings of enum / const `value` that are instances of `schema`: its
        integral numbers as integers and / or with a fraction part, as the schema accepts
        them (draft 4: 2.0 is no integer); None if neither."""
        ints, floats = integral_as(value, int), integral_as(value, float)
        as_int = self.accepts(schema, ints)
        if repr(ints) == repr(floats):  # no integral number in it
            return literal(value) if as_int else None
        as_float = self.accepts(schema, floats)
        if as_int and as_float:
            return literal(value)
        if as_int or as_float:
            return literal(value, fractions=False if as_int else "only")
        return None

    def accepts(self, schema: Any, value: Any) -> bool:
        """Whether `value` is an instance of `schema` (a part of the root: its local `$ref`s
        resolve against the root), by the jsonschema library with formats asserted."""
        if self._validator is None:
            import jsonschema

            cls = jsonschema.validators.validator_for(self.root)
            root = self.root if isinstance(self.root, dict) else {}
            self._validator = cls(root, format_checker=cls.FORMAT_CHECKER)
        clean = {k: v for k, v in schema.items() if not k.startswith("_")}
        fmt = clean.get("format")
        if isinstance(value, str) and fmt in FORMAT_REGEXES:
            # the library skips formats whose checker is not installed: ours decide
            if not re.fullmatch(FORMAT_REGEXES[fmt], value):
                return False
        try:
            return bool(self._validator.evolve(schema=clean).is_valid(value))
        except Exception as e:  # an unresolvable reference, a malformed keyword
            raise UnsupportedSchemaError("enum", "#", f"cannot check a value: {e}") from None

    def from_norm(self, norm: dict | bool, ptr: str) -> Node:
        if norm is False:
            return None
        if norm is True:
            return self.any_value(self.any_depth)
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
                merged = merge(norm, self.normalise(branch, at), at)
                node = self.from_norm(merged, at)
                self.lossy_nodes[id(merged)] = losses() != before
                if kind == "oneOf" and node is None and self.lossy_nodes[id(merged)]:
                    # empty only as approximated: its instances must still be excluded
                    raise UnsupportedSchemaError(kind, at, "branch not exact (cannot exclude it)")
                options.append((node, merged, at))
            if kind == "oneOf":
                live = [o for o in options if o[0] is not None]
                try:
                    self.check_exclusive(live, where)
                except UnsupportedSchemaError:
                    split = json_oneof.split_oneof(self, [o[1] for o in live], where)
                    if split is None:
                        raise
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
            return ra.alt([self.literal_of(s, v) for v in values if canonical(v) not in excluded])
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
        if t != "string":  # 1 and 1.0 are one number; objects and arrays have many spellings
            raise UnsupportedSchemaError("not", ptr, f"of {t} enum values")
        # strings: over canonical spellings, so that no other spelling of a value slips in
        dfa = dfa_ops.product(node_to_dfa(node), node_to_dfa(ra.parsed(CANONICAL_TEXT)), True)
        dfa = dfa_ops.product(dfa, node_to_dfa(ra.alt([literal(v) for v in mine])), False)
        return dfa_ops.DFANode(dfa, "not", ptr) if dfa.accepting.any() else None

    def typed(self, t: str, s: dict, ptr: str) -> Node:
        if t == "string":
            return self.string(s, ptr)
        if t == "integer":
            return self.integer(s, ptr)
        if t == "number":
            return self.number(s, ptr)
        if t == "boolean":
            return ra.alt([ra.lit("true"), ra.lit("false")])
        if t == "null":
            return ra.lit("null")
        if t == "object":
            return self.object(s, ptr)
        if t == "array":
            return self.array(s, ptr)
        raise GrammarError(f"unknown type {t!r} at {ptr}/type")

    def any_value(self, depth: int) -> object:
        note_loss()  # values nested deeper than any_depth are left out
        if depth not in self._any:
            options = [self.any_string, ra.parsed(numbers.NUMBER)]
            options += [ra.lit("true"), ra.lit("false"), ra.lit("null")]
            if depth > 0:
                inner = self.any_value(depth - 1)
                member = ra.seq(self.any_string, self.colon, inner)
                members = ra.seq(member, ra.repeat(ra.seq(self.comma, member), 0, None))
                options.append(self.wrap("{", ra.optional(members), "}"))
                elems = ra.seq(inner, ra.repeat(ra.seq(self.comma, inner), 0, None))
                options.append(self.wrap("[", ra.optional(elems), "]"))
            self._any[depth] = _any_automaton(ra.alt(options), self.ws_text, depth)
        return self._any[depth]

    def wrap(self, open_: str, inner: Node, close: str) -> Node:
        return ra.seq(ra.char(open_), self.ws, inner, self.ws, ra.char(close))

    # ----- strings and numbers -----
    def string(self, s: dict, ptr: str) -> Node:
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        fmt, pattern = s.get("format"), s.get("pattern")
        if fmt in UNSUPPORTED_FORMATS:
            raise UnsupportedSchemaError("format", f"{ptr}/format", repr(fmt))
        if hi is not None and hi < lo:
            return None
        content: Node
        if pattern is not None:
            try:
                if fmt in FORMAT_REGEXES:  # both: the product of the two automata
                    both = dfa_ops.product(
                        node_to_dfa(pattern_to_content(pattern, self.string_char)),
                        node_to_dfa(ra.parsed(FORMAT_REGEXES[fmt])),
                        True,
                    )
                    content = dfa_ops.DFANode(both, "pattern", f"{ptr}/pattern")
                    if lo or hi is not None:
                        content = self.length_bounded(content, lo, hi, ptr)
                elif lo or hi is not None:
                    content = _bounded_class_pattern(pattern, lo, hi, self.string_char)
                    if content is False:
                        content = self.length_bounded(
                            pattern_to_content(pattern, self.string_char), lo, hi, ptr
                        )
                else:
                    content = pattern_to_content(pattern, self.string_char)
            except GrammarError as e:
                if isinstance(e, UnsupportedSchemaError):
                    raise
                raise UnsupportedSchemaError("pattern", f"{ptr}/pattern", str(e)) from None
        elif fmt in FORMAT_REGEXES:
            content = ra.parsed(FORMAT_REGEXES[fmt])
            if lo or hi is not None:
                content = self.length_bounded(content, lo, hi, ptr)
        elif not lo and hi is None:
            return self.any_string
        else:
            content = ra.repeat(self.string_char, lo, hi)
        return ra.seq(ra.char('"'), content, ra.char('"'))

    def length_bounded(self, content: Node, lo: int, hi: int | None, ptr: str) -> Node:
        """String content `content` restricted to lo..hi decoded characters (exact, via a
        product of its DFA with a character counter)."""
        if content is None:
            return None
        key = "maxLength" if hi is not None else "minLength"
        try:
            dfa = dfa_ops.with_length(node_to_dfa(content), lo, hi)
        except GrammarError as e:
            raise UnsupportedSchemaError(key, ptr, f"with a pattern / format: {e}") from None
        return dfa_ops.DFANode(dfa, key, ptr)

    def integer(self, s: dict, ptr: str) -> Node:
        bounds = _bounds(s)
        if bounds == (None,) * 4 and s.get("multipleOf") is None:
            return _leaf(numbers.INTEGER, "integer")
        return numbers.number_node("integer", *bounds, s.get("multipleOf"), ptr)

    def number(self, s: dict, ptr: str) -> Node:
        bounds = _bounds(s)
        if bounds == (None,) * 4 and s.get("multipleOf") is None:
            return _leaf(numbers.NUMBER, "number")
        return numbers.number_node("number", *bounds, s.get("multipleOf"), ptr)

    def array(self, s: dict, ptr: str) -> Node:
        if s.get("uniqueItems"):
            raise UnsupportedSchemaError("uniqueItems", f"{ptr}/uniqueItems")
        items = s.get("items", True)
        if "prefixItems" in s:
            prefix, rest, rest_ptr = s["prefixItems"], items, f"{ptr}/items"
        elif isinstance(items, list):
            prefix, rest, rest_ptr = items, s.get("additionalItems", True), f"{ptr}/additionalItems"
        else:
            prefix, rest, rest_ptr = [], items, f"{ptr}/items"
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        elems: list[Node] = [
            self.value(p, f"{ptr}/{'prefixItems' if 'prefixItems' in s else 'items'}/{i}")
            for i, p in enumerate(prefix)
        ]
        # positions past an impossible element cannot exist
        for i, e in enumerate(elems):
            if e is None:
                elems, hi = elems[:i], i if hi is None else min(hi, i)
                break
        rest_re = self.value(rest, rest_ptr) if (hi is None or hi > len(elems)) else None
        if rest_re is None:
            hi = len(elems) if hi is None else min(hi, len(elems))
        if hi is not None and hi < lo:
            return None
        k = len(elems)

        def tail(i: int) -> Node:
            """What may follow once i >= 1 elements are written."""
            if hi is not None and i >= hi:
                return ra.EMPTY
            if i >= k:
                if rest_re is None:
                    return ra.EMPTY
                top = None if hi is None else hi - i
                return ra.repeat(ra.seq(self.comma, rest_re), max(0, lo - i), top)
            step = ra.seq(self.comma, elems[i], tail(i + 1))
            return step if i < lo else ra.optional(step)

        first = elems[0] if k else rest_re
        if hi == 0 or first is None:
            inner: Node = ra.EMPTY if lo == 0 else None
        else:
            body = ra.seq(first, tail(1))
            inner = body if lo > 0 else ra.optional(body)
        return self.wrap("[", inner, "]")


_ALL_TYPES = ("string", "number", "boolean", "null", "object", "array")
# a count keyword -> (the type it applies to, the keyword its failures satisfy)
_COUNT_KEYS = {
    "maxProperties": ("object", "minProperties"),
    "minProperties": ("object", "maxProperties"),
    "maxLength": ("string", "minLength"),
    "minLength": ("string", "maxLength"),
    "maxItems": ("array", "minItems"),
    "minItems": ("array", "maxItems"),
}


def _text(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


def _bounds(s: dict) -> tuple:
    mn, mx = s.get("minimum"), s.get("maximum")
    emn, emx = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    if isinstance(emn, bool):  # draft 4: a flag on minimum
        emn, mn = (mn, None) if emn else (None, mn)
    if isinstance(emx, bool):
        emx, mx = (mx, None) if emx else (None, mx)
    return mn, mx, emn, emx


def _bounded_class_pattern(pattern: str, lo: int, hi: int | None, any_char: object) -> Node | bool:
    """`^[class]+$`-style patterns with length bounds: the class repeated lo..hi times."""
    m = re.fullmatch(r"\^(\[(?:[^\]\\]|\\.)+\]|\\[dw]|\.)([+*])\$", pattern)
    if not m:
        return False
    one = pattern_to_content(f"^{m.group(1)}$", any_char)
    if m.group(2) == "+":
        lo = max(lo, 1)
    return ra.repeat(one, lo, hi)


_ANY_DFAS: dict[tuple[str, int], object] = {}
_LEAVES: dict[str, object] = {}


def _leaf(text: str, keyword: str) -> object:
    """A piece most schemas hold many times (a plain string, a number), as a prebuilt
    automaton shared by every schema: the NFA embeds it without building its states, and the
    lazy DFA reads only those walks reach. Keeps its regex text for json_schema_to_regex."""
    node = _LEAVES.get(text)
    if node is None:
        node = _LEAVES.setdefault(
            text, dfa_ops.DFANode(node_to_dfa(ra.parsed(text)), keyword, "#", text)
        )
    return node


def _any_automaton(node: object, ws: str, depth: int) -> object:
    """Any JSON value nested at most `depth` deep, as a prebuilt automaton shared by every
    schema (built once per whitespace and depth: most schemas hold it, as additional
    members' values), keeping its regex text for json_schema_to_regex."""
    key = (ws, depth)
    if key not in _ANY_DFAS:
        _ANY_DFAS[key] = dfa_ops.DFANode(node_to_dfa(node), "any", "#", ra.to_text(node))
    return _ANY_DFAS[key]


def _integral_counts(schema: dict, ptr: str) -> dict:
    """Count keywords (minLength, maxItems, ...) as ints: 2.0 is 2; others are errors."""
    bad = [k for k in _COUNT_KEYS if k in schema and not isinstance(schema[k], int)]
    bad += [k for k in _COUNT_KEYS if isinstance(schema.get(k), bool)]
    if not bad and all(schema[k] >= 0 for k in _COUNT_KEYS if k in schema):
        return schema
    out = dict(schema)
    for k in _COUNT_KEYS:
        v = out.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or v != int(v):
            raise GrammarError(f"{k} at {ptr} must be a non-negative integer, not {v!r}")
        out[k] = int(v)
    return out


def _dependent_schemas(schema: dict) -> tuple[dict, list[tuple[str, str, Any]]]:
    """Splits off the `dependencies` / `dependentSchemas` entries whose value is a schema, as
    (pointer part, name, schema); name-list entries stay (the object rules split on them)."""
    out, dependent = schema, []
    for key in ("dependencies", "dependentSchemas"):
        value = schema.get(key)
        if not isinstance(value, dict):
            continue
        out = dict(out)
        lists = {n: v for n, v in value.items() if isinstance(v, list)}
        dependent += [
            (f"{key}/{ptr_escape(n)}", n, v) for n, v in value.items() if not isinstance(v, list)
        ]
        if key == "dependentSchemas" or not lists:
            out.pop(key)
        else:
            out[key] = lists
    return out, dependent


def dtype_to_regex(dtype: type) -> str:
    """Regex for gen(dtype=...): int, float, bool (True|False), str (a JSON string)."""
    if dtype is bool:
        return "(True|False)"
    if dtype is int:
        return numbers.INTEGER
    if dtype is float:
        return numbers.NUMBER
    if dtype is str:
        return STRING_TEXT
    raise GrammarError(f"unsupported dtype {dtype!r}: use int, float, bool or str")


__all__ = ["dtype_to_regex", "json_schema_to_node", "json_schema_to_regex", "load_schema"]
