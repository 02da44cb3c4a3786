"""`$dynamicRef` resolved statically: the document expanded with its dynamic scope carried.

A `$dynamicRef` resolves first like a `$ref`; when that schema has a `$dynamicAnchor` of the
reference's name, the target is instead the anchor of that name in the outermost schema
resource of the dynamic scope (the resources evaluation entered on its way: the root, each
`$ref` target's, each subschema with an `$id`). Only the outermost anchor of each name
counts, so the part of the scope that matters is a binding name -> anchor, fixed the first
time a resource with that name enters. The document is walked from its root with that
binding: every reference becomes a `$ref` to a copy of its target expanded under the
binding in force there (one copy per target and binding, under `$defs`), so recursion
terminates and each `$dynamicRef` is a plain `$ref`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grammar.errors import UnsupportedSchemaError

MAX_COPIES = 256  # (target, binding) copies of one document
_DROP = ("$id", "$anchor", "$dynamicAnchor", "$ref", "$dynamicRef")

Binding = dict[str, str]  # $dynamicAnchor name -> JSON pointer of the anchor that wins


def expand_dynamic(
    root: dict,
    resolve: Callable[[str, str], str | None],
    bases: dict[int, str],
    at_ptr: dict[str, Any],
    keys: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]],
) -> dict:
    """`root` with every `$ref` / `$dynamicRef` a JSON pointer to an expanded copy (module
    doc). `resolve(base, ref)` is the pointer ("#...") a reference names, `bases` the base URI
    of each schema dict, `at_ptr` the schema at each pointer, `keys` the keywords holding one
    schema, a list of them, a name -> schema map."""
    one, many, named = keys
    anchors: dict[str, Binding] = {}  # resource base -> its dynamic anchors
    for ptr, s in at_ptr.items():
        if isinstance(s, dict) and isinstance(s.get("$dynamicAnchor"), str):
            mine = anchors.setdefault(bases[id(s)], {})
            if s["$dynamicAnchor"] in mine:  # names are unique in a resource
                where = f"#{ptr}/$dynamicAnchor"
                raise UnsupportedSchemaError("$dynamicAnchor", where, "twice in one resource")
            mine[s["$dynamicAnchor"]] = ptr
    taken = set(root.get("$defs", {}) or {})
    prefix = next(p for p in (f"_dynamic{'_' * i}" for i in range(99)) if not _clash(p, taken))
    copies: dict[tuple, str] = {}
    defs: dict[str, Any] = {}

    def enter(schema: dict, binding: Binding) -> Binding:
        new = anchors.get(bases.get(id(schema), ""), {})
        if all(n in binding for n in new):
            return binding
        return {**{n: p for n, p in new.items() if n not in binding}, **binding}

    def copy_of(ptr: str, binding: Binding) -> str:
        target = at_ptr.get(ptr)
        if not isinstance(target, dict):
            return "#" + ptr  # a boolean schema: the same everywhere
        binding = enter(target, binding)
        key = (ptr, tuple(sorted(binding.items())))
        if key not in copies:
            if len(copies) >= MAX_COPIES:
                raise UnsupportedSchemaError("$dynamicRef", "#", f"over {MAX_COPIES} scopes")
            copies[key] = name = f"{prefix}{len(copies)}"
            defs[name] = walk(target, binding)
        return f"#/$defs/{copies[key]}"

    def walk(schema: Any, binding: Binding, depth: int = 0) -> Any:
        if not isinstance(schema, dict):
            return schema
        if depth > 200:
            raise UnsupportedSchemaError("$dynamicRef", "#", "a document nested over 200 deep")
        binding = enter(schema, binding)
        base = bases.get(id(schema), "")
        out = {k: v for k, v in schema.items() if k not in _DROP}
        refs = []
        for key in ("$ref", "$dynamicRef"):
            ref = schema.get(key)
            if not isinstance(ref, str):
                continue
            local = resolve(base, ref)
            if local is None:
                out[key] = ref  # names no place here: refused by the builder
                continue
            name = ref.partition("#")[2]
            target = at_ptr.get(local[1:])
            if key == "$dynamicRef" and isinstance(target, dict):
                if target.get("$dynamicAnchor") == name and name in binding:
                    local = "#" + binding[name]  # bookended: the outermost anchor wins
            refs.append(copy_of(local[1:], binding))
        for key in one:
            if isinstance(schema.get(key), dict | bool):
                out[key] = walk(schema[key], binding, depth + 1)
        for key in many:
            if isinstance(schema.get(key), list):
                out[key] = [walk(s, binding, depth + 1) for s in schema[key]]
        for key in named:
            if isinstance(schema.get(key), dict):
                out[key] = {n: walk(s, binding, depth + 1) for n, s in schema[key].items()}
        if refs and "$ref" not in out:
            out["$ref"], refs = refs[0], refs[1:]
        if refs:  # both a $ref and a $dynamicRef: both apply
            out["allOf"] = [*out.get("allOf", []), *({"$ref": r} for r in refs)]
        return out

    out = walk(root, {})
    out["$defs"] = {**(out.get("$defs", {}) or {}), **defs}
    return out


def _clash(prefix: str, taken: set[str]) -> bool:
    return any(t.startswith(prefix) for t in taken)
