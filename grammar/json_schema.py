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

import itertools
import json
import re
from typing import Any

from grammar import dfa_ops, json_oneof, numbers
from grammar import regex_ast as ra
from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.formats import FORMAT_REGEXES, UNSUPPORTED_FORMATS
from grammar.fsm import node_to_dfa
from grammar.json_oneof import CANONICAL_TEXT
from grammar.pattern import pattern_to_content
from grammar.schema_merge import (
    ANNOTATIONS,
    ASSERTIONS,
    UNSUPPORTED,
    canonical,
    merge,
    type_set,
)

STRING_CHAR_TEXT = r'([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'
STRING_TEXT = f'"{STRING_CHAR_TEXT}*"'
MAX_ALTERNATIVES = 256
MAX_OBJECT_COPIES = 4096  # member-count states of one object with minProperties / maxProperties

Node = object | None  # a regex node (grammar.regex_ast); None matches nothing


def _literal(value: Any) -> object:
    return ra.lit(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


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
    out = _Builder(root, whitespace or "", max_recursion_depth, any_depth).value(root, "#")
    if out is None:
        raise GrammarError("the schema admits no instance")
    return out


class _Builder:
    def __init__(self, root: dict | bool, ws: str, max_depth: int, any_depth: int) -> None:
        self.root = root
        self.ws = ra.parsed(ws) if ws else ra.EMPTY
        self.comma = ra.seq(self.ws, ra.char(","), self.ws)
        self.colon = ra.seq(self.ws, ra.char(":"), self.ws)
        self.string_char = ra.parsed(STRING_CHAR_TEXT)
        self.any_string = ra.parsed(STRING_TEXT)
        self.max_depth = max_depth
        self.any_depth = any_depth
        self.ref_stack: list[str] = []
        self._any: dict[int, object] = {}
        self.n_alternatives = 0
        self._validator: Any = None

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
        for key in UNSUPPORTED:
            if key in schema and not (key in _DEPENDENCY_KEYS and _name_lists(schema[key])):
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
        if alts:
            out["_alts"] = alts
        if "$ref" in schema:
            ref = schema["$ref"]
            if self.ref_stack.count(ref) >= self.max_depth:
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
        if negated and len(negated[1]) == 1:  # one way to violate it: a plain conjunction
            out = merge(out, self.normalise(negated[1][0], negated[2]), negated[2])
        return out

    def violations(self, schema: Any, ptr: str) -> list:
        """Schemas whose union is exactly the instances that fail `schema` (for `not`): one
        per keyword of the conjunction, each the instances that keyword rejects. Keywords
        whose failures we cannot describe raise UnsupportedSchemaError naming `not`."""
        n = self.normalise(schema, ptr)
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
            return ra.alt([_literal(v) for v in values if self.accepts(schema, v)])
        return self.from_norm(self.normalise(schema, ptr), ptr)

    def finite_values(self, schema: Any, ptr: str, depth: int = 0) -> list | None:
        """The values of an `enum` / `const` the schema is conjoined with (at its own level,
        through `$ref` or an `allOf` branch), or None."""
        if not isinstance(schema, dict) or depth > 8:
            return None
        values = _values_of(schema)
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

    def accepts(self, schema: Any, value: Any) -> bool:
        """Whether `value` is an instance of `schema` (a part of the root: its local `$ref`s
        resolve against the root), by the jsonschema library with formats asserted."""
        if self._validator is None:
            import jsonschema

            cls = jsonschema.validators.validator_for(self.root)
            root = self.root if isinstance(self.root, dict) else {}
            self._validator = cls(root, format_checker=cls.FORMAT_CHECKER)
        clean = {k: v for k, v in schema.items() if not k.startswith("_")}
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
            if kind == "oneOf" and len(branches) > 1 and _required_only(branches):
                kind, branches = "anyOf", _exactly_one_required(branches, where)
            options: list[tuple[Node, Any, str]] = []
            for i, branch in enumerate(branches):
                self.count_alternative(kind, where)
                at = f"{where}/{i}"
                merged = merge(norm, self.normalise(branch, at), at)
                options.append((self.from_norm(merged, at), merged, at))
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

    def check_exclusive(self, options: list[tuple[Node, Any, str]], ptr: str) -> None:
        """oneOf needs exactly one branch to match, so every two branches must be provably
        disjoint: different JSON types, different values of a required discriminator property,
        or (for scalars only, whose spelling is canonical) disjoint regex languages."""
        from grammar.fsm import node_to_dfa
        from grammar.intersect import dfas_intersect

        for (na, sa, _), (nb, sb, _) in itertools.combinations(options, 2):
            if not (isinstance(sa, dict) and isinstance(sb, dict)):
                raise UnsupportedSchemaError("oneOf", ptr, "branches may both match")
            ta, tb = self.types_of(sa), self.types_of(sb)
            if not (ta & tb) or self.discriminated(sa, sb, ptr):
                continue
            if (ta | tb) & {"object", "array"}:
                raise UnsupportedSchemaError("oneOf", ptr, "branches may both match")
            try:
                overlap = dfas_intersect(node_to_dfa(na, 20_000), node_to_dfa(nb, 20_000))
            except GrammarError:
                overlap = True
            if overlap:
                raise UnsupportedSchemaError("oneOf", ptr, "branches may both match")

    def discriminated(self, a: dict, b: dict, ptr: str) -> bool:
        """Both are objects-only, and some property one of them requires has, in the other,
        a schema with no value in common (forbidden, different enum / const values, or
        scalar schemas whose languages are disjoint)."""
        if _possible_types(a) != {"object"} or _possible_types(b) != {"object"}:
            return False
        for x, y in ((a, b), (b, a)):
            for name in x.get("required", []):
                sx, sy = json_oneof.member_schema(x, name), json_oneof.member_schema(y, name)
                if sx is False or sy is False:
                    return True
                if isinstance(sx, dict) and isinstance(sy, dict) and self.disjoint(sx, sy, ptr):
                    return True
        return False

    def disjoint(self, a: dict, b: dict, ptr: str) -> bool:
        """Provably no value is an instance of both (finite value sets, or scalar schemas
        whose regex languages do not intersect)."""
        from grammar.intersect import dfas_intersect

        for x, y in ((a, b), (b, a)):
            values = self.finite_values(x, ptr)
            if values is not None:  # exact: is any value of x an instance of y?
                return not any(self.accepts(x, v) and self.accepts(y, v) for v in values)
        try:
            na, nb = self.normalise(a, ptr), self.normalise(b, ptr)
            if not (isinstance(na, dict) and isinstance(nb, dict)):
                return False
            if (self.types_of(na) | self.types_of(nb)) & {"object", "array"}:
                return False
            ra_, rb = self.from_norm(na, ptr), self.from_norm(nb, ptr)
            if ra_ is None or rb is None:
                return True
            return not dfas_intersect(node_to_dfa(ra_, 20_000), node_to_dfa(rb, 20_000))
        except GrammarError:
            return False

    def types_of(self, s: dict, depth: int = 0) -> set[str]:
        """JSON types an instance of normalised `s` can have: its own keywords' types, within
        the union of each anyOf / oneOf group's branch types (all types past depth 3)."""
        types = _possible_types(s)
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
            return ra.alt(
                [_literal(v) for v in values if self.accepts(s, v) and canonical(v) not in excluded]
            )
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
        mine = [v for v in excluded if _kind(v) == t or (t == "number" and _kind(v) == "integer")]
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
        dfa = dfa_ops.product(dfa, node_to_dfa(ra.alt([_literal(v) for v in mine])), False)
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
            self._any[depth] = ra.alt(options)
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
        return numbers.number_node("integer", *_bounds(s), s.get("multipleOf"), ptr)

    def number(self, s: dict, ptr: str) -> Node:
        return numbers.number_node("number", *_bounds(s), s.get("multipleOf"), ptr)

    # ----- objects and arrays -----
    def object(self, s: dict, ptr: str) -> Node:
        deps: dict[str, list[str]] = {}
        for key in _DEPENDENCY_KEYS:
            deps.update(s.get(key, {}))
        if deps:
            return self.object_with_dependencies(s, deps, ptr)
        props: dict[str, Any] = dict(s.get("properties", {}))
        required = list(dict.fromkeys(s.get("required", [])))
        extra = s.get("additionalProperties", True)
        names_ok = self.property_names(s, ptr)
        for name in dict.fromkeys([*props, *required]):
            # a member's value: its property schema and every patternProperty it matches;
            # a required name that is no property: the schema any member of that name meets
            if name not in props:
                props[name] = json_oneof.member_schema(s, name)
                continue
            sub = props[name]
            pp = s.get("patternProperties", {})
            matching = [v for p, v in pp.items() if _search(p, name, f"{ptr}/patternProperties")]
            if sub is not False and matching:
                sub = {"allOf": [sub, *matching]}
            props[name] = sub
        for name in props if names_ok is not None else ():
            if not names_ok(name):
                props[name] = False
        extra_members: list[tuple[Node, Node]] = []  # (quoted key, value) of other members
        if s.get("patternProperties"):
            extra_members = self.pattern_member(s, props, ptr)
        elif extra is not False:
            extra_value = self.value(extra, f"{ptr}/additionalProperties")
            extra_members = [(self.string_except(list(props), ptr), extra_value)]
        if names_ok is not None:
            extra_members = [(names_ok.keys(k), v) for k, v in extra_members]
        extra_item = ra.alt([ra.seq(k, self.colon, v) for k, v in extra_members])
        items: list[tuple[object, bool]] = []  # (node of '"key":value', required)
        for name, sub in props.items():
            v = self.value(sub, f"{ptr}/properties/{_ptr_escape(name)}")
            if v is None:
                if name in required:
                    return None
                continue
            items.append((ra.seq(_literal(name), self.colon, v), name in required))
        lo, hi = s.get("minProperties", 0), s.get("maxProperties")
        return self.wrap("{", self.members(items, extra_item, lo, hi, ptr), "}")

    def members(
        self, items: list[tuple[object, bool]], extra: Node, lo: int, hi: int | None, ptr: str
    ) -> Node:
        """The members of an object: `items` in order (required or optional), then any number
        of `extra` members, with lo..hi members in all (minProperties / maxProperties). The
        count matters only up to `top`; past it members are free."""
        top = max(lo, 1 if hi is None else hi + 1)
        memo: dict[tuple[int, int], Node] = {}
        budget = [MAX_OBJECT_COPIES]

        def rest(i: int, c: int) -> Node:  # c members written so far (capped at top)
            if (i, c) in memo:
                return memo[(i, c)]
            budget[0] -= 1
            if budget[0] < 0:
                key = "maxProperties" if hi is not None else "minProperties"
                raise UnsupportedSchemaError(key, f"{ptr}/{key}", "too many optional members")
            sep = self.comma if c else ra.EMPTY
            if i == len(items):
                need = max(0, lo - c)
                room = None if hi is None else hi - c
                if extra is None or room == 0:
                    out: Node = ra.EMPTY if need == 0 else None
                elif c:
                    out = ra.repeat(ra.seq(self.comma, extra), need, room)
                else:
                    more = ra.repeat(
                        ra.seq(self.comma, extra),
                        max(0, need - 1),
                        None if room is None else room - 1,
                    )
                    many = ra.seq(extra, more)
                    out = many if need else ra.optional(many)
            else:
                node, req = items[i]
                nxt = min(c + 1, top)
                if hi is not None and c >= hi:
                    take = None
                else:
                    after = rest(i + 1, nxt)
                    take = None if after is None else ra.seq(sep, node, after)
                if req:
                    out = take
                elif nxt == c and take is not None:  # the count no longer matters
                    out = ra.seq(ra.optional(ra.seq(sep, node)), rest(i + 1, c))
                else:
                    out = ra.alt([take, rest(i + 1, c)])
            memo[(i, c)] = out
            return out

        return rest(0, 0)

    def property_names(self, s: dict, ptr: str) -> Any:
        """`propertyNames` as a filter: names_ok(name) and names_ok.keys(quoted key node)."""
        pn = s.get("propertyNames")
        if pn is None or pn is True or pn == {}:
            return None
        where = f"{ptr}/propertyNames"
        if pn is False:
            names = None
        else:
            names = self.value({"allOf": [pn, {"type": "string"}]}, where)

        class _Names:
            def __call__(_, name: str) -> bool:
                return pn is not False and self.accepts(pn, name)

            def keys(_, key: Node) -> Node:
                if names is None or key is None:
                    return None
                both = dfa_ops.product(node_to_dfa(key), node_to_dfa(names), True)
                return (
                    dfa_ops.DFANode(both, "propertyNames", where) if both.accepting.any() else None
                )

        return _Names()

    def object_with_dependencies(self, s: dict, deps: dict, ptr: str) -> Node:
        """`dependencies` / `dependentRequired` with name lists: one object per choice of which
        trigger names are present (present: it and its names required; absent: forbidden).
        The choices are disjoint and together exactly the instances the keyword allows."""
        if len(deps) > 3:
            raise UnsupportedSchemaError("dependencies", ptr, "more than 3 trigger names")
        base = {k: v for k, v in s.items() if k not in _DEPENDENCY_KEYS}
        options: list[Node] = []
        for present in itertools.product((True, False), repeat=len(deps)):
            props = dict(base.get("properties", {}))
            required = list(base.get("required", []))
            for (trigger, names), here in zip(deps.items(), present, strict=True):
                if here:
                    required += [trigger, *names]
                else:
                    props[trigger] = False
            if any(props.get(name) is False for name in required):
                continue
            options.append(
                self.object(
                    {**base, "properties": props, "required": list(dict.fromkeys(required))}, ptr
                )
            )
        return ra.alt(options)

    def pattern_member(self, s: dict, props: dict, ptr: str) -> list[tuple[Node, Node]]:
        """`patternProperties` (up to 3 patterns): the members other than `properties`.

        Each key (not a property name) falls in one region, the set of patterns it matches;
        its value must satisfy all of their schemas, or `additionalProperties` when it matches
        none. Regions are exact DFA products; a region that excludes some pattern holds only
        escape-free keys (where the pattern DFA is exact), so keys needing escapes there are
        valid but never generated. Returns (quoted key, value) pairs, [] if no member fits."""
        pp = s.get("patternProperties")
        where = f"{ptr}/patternProperties"
        extra = s.get("additionalProperties", True)
        if len(pp) > 3:
            raise UnsupportedSchemaError("patternProperties", where, "more than 3 patterns")
        required = [n for n in s.get("required", []) if n not in props]
        try:
            pats, contents = [], []
            for pattern in pp:
                contents.append(pattern_to_content(pattern, self.string_char))
                pats.append(node_to_dfa(contents[-1]))
            literal = ip_char_not(['"', "\\", *map(chr, range(0x20))])
            keys = node_to_dfa(ra.repeat(literal, 0, None))
            anykey = node_to_dfa(ra.repeat(self.string_char, 0, None))
            names = [
                n for n in [*props, *required] if not any(ord(c) < 0x20 or c in '"\\' for c in n)
            ]
            if names:
                keys = dfa_ops.product(keys, node_to_dfa(ra.alt([ra.lit(n) for n in names])), False)
            named_inside = any(all(_search(p, n, where) for p in pp) for n in props)
            members: list[tuple[Node, Node]] = []
            for inside in itertools.product((True, False), repeat=len(pats)):
                # a key in every pattern may use escapes (pattern_to_content is sound) unless
                # a property name matches them all (it must stay out, in every spelling);
                # "matches none of" needs exactness: escape-free keys
                region = keys if not all(inside) or named_inside else anykey
                for dfa, keep in zip(pats, inside, strict=True):
                    region = dfa_ops.product(region, dfa, keep)
                if not region.accepting.any():
                    continue
                subs = [sub for sub, keep in zip(pp.values(), inside, strict=True) if keep]
                if not subs:
                    if extra is False:
                        continue
                    value = self.value(extra, f"{ptr}/additionalProperties")
                elif len(subs) == 1:
                    (pat,) = [p for p, k in zip(pp, inside, strict=True) if k]
                    value = self.value(subs[0], f"{where}/{_ptr_escape(pat)}")
                else:
                    value = self.value({"allOf": subs}, where)
                key: Node = dfa_ops.DFANode(region, "patternProperties", where)
                if inside == (True,) and not named_inside:
                    key = contents[0]  # the same language, and it has a regex text form
                members.append((ra.seq(ra.char('"'), key, ra.char('"')), value))
        except (re.error, GrammarError) as e:
            if isinstance(e, UnsupportedSchemaError):
                raise
            raise UnsupportedSchemaError("patternProperties", where, str(e)) from None
        return members

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

    def string_except(self, names: list[str], ptr: str) -> object:
        """A JSON string whose content is none of `names` (the complement of a trie)."""
        if not names:
            return self.any_string
        if any(ord(ch) < 0x20 or ch in '"\\' for name in names for ch in name):
            raise UnsupportedSchemaError("additionalProperties", ptr, "a name needs escapes")
        trie: dict = {}
        for name in names:
            node = trie
            for ch in name:
                node = node.setdefault(ch, {})
            node[""] = {}
        escape = ra.parsed(r'\\["\\/bfnrt]|\\u[0-9a-fA-F]{4}')
        rest = ra.repeat(self.string_char, 0, None)

        def complement(node: dict) -> Node:
            children = [c for c in node if c]
            other = ra.alt([ip_char_not(children), escape])
            options = [ra.seq(other, rest)]
            if "" not in node:
                options.append(ra.EMPTY)
            options += [ra.seq(ra.char(c), complement(node[c])) for c in children]
            return ra.alt(options)

        return ra.seq(ra.char('"'), complement(trie), ra.char('"'))


def ip_char_not(excluded: list[str]) -> object:
    from interegular import patterns as ip

    bad = frozenset('"\\') | frozenset(chr(i) for i in range(0x20)) | frozenset(excluded)
    return ip._CharGroup(bad, True)


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer()):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _values_of(s: dict) -> list | None:
    if "const" in s:
        return [s["const"]]
    return list(s["enum"]) if "enum" in s else None


def _possible_types(s: dict) -> set[str]:
    values = _values_of(s)
    types = type_set(s)
    if values is not None:
        kinds = {_kind(v) for v in values}
        types &= kinds | ({"number"} if "integer" in kinds else set())
    return types


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


def _search(pattern: str, name: str, ptr: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error as e:
        raise UnsupportedSchemaError("patternProperties", ptr, f"{pattern!r}: {e}") from None


def _bounds(s: dict) -> tuple:
    mn, mx = s.get("minimum"), s.get("maximum")
    emn, emx = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
    if isinstance(emn, bool):  # draft 4: a flag on minimum
        emn, mn = (mn, None) if emn else (None, mn)
    if isinstance(emx, bool):
        emx, mx = (mx, None) if emx else (None, mx)
    return mn, mx, emn, emx


def _required_only(branches: list) -> bool:
    return all(
        isinstance(b, dict)
        and "required" in b
        and set(b) <= {"required"} | ANNOTATIONS
        and all(isinstance(n, str) for n in b["required"])
        for b in branches
    )


def _exactly_one_required(branches: list[dict], ptr: str) -> list[dict]:
    """oneOf of `required` lists as disjoint object schemas, one per set of present names
    (among those the branches mention) that satisfies exactly one branch; the others are
    forbidden. A non-object satisfies every branch, so (two or more branches) none is valid."""
    names = list(dict.fromkeys(n for b in branches for n in b["required"]))
    if len(names) > 8:
        raise UnsupportedSchemaError("oneOf", ptr, "more than 8 required names")
    out = []
    for present in itertools.product((True, False), repeat=len(names)):
        here = {n for n, p in zip(names, present, strict=True) if p}
        if sum(set(b["required"]) <= here for b in branches) != 1:
            continue
        out.append(
            {
                "type": "object",
                "required": [n for n in names if n in here],
                "properties": {n: False for n in names if n not in here},
            }
        )
    return out or [False]


_DEPENDENCY_KEYS = ("dependencies", "dependentRequired")


def _name_lists(value: Any) -> bool:
    """`dependencies` in its name-list form (the schema form is not supported)."""
    return isinstance(value, dict) and all(
        isinstance(v, list) and all(isinstance(n, str) for n in v) for v in value.values()
    )


def _ptr_escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _bounded_class_pattern(pattern: str, lo: int, hi: int | None, any_char: object) -> Node | bool:
    """`^[class]+$`-style patterns with length bounds: the class repeated lo..hi times."""
    m = re.fullmatch(r"\^(\[(?:[^\]\\]|\\.)+\]|\\[dw]|\.)([+*])\$", pattern)
    if not m:
        return False
    one = pattern_to_content(f"^{m.group(1)}$", any_char)
    if m.group(2) == "+":
        lo = max(lo, 1)
    return ra.repeat(one, lo, hi)


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
