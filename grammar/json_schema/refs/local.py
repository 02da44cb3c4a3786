"""`$ref`s through `$id`, `$anchor` and relative URIs inside one document, made local JSON
pointers (`local_refs`); `$dynamicRef` through the dynamic scope (`refs.dynamic`)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin, urlsplit, uses_relative

from grammar.errors import UnsupportedSchemaError
from grammar.json_schema.refs.dynamic import expand_dynamic

# ----- references through $id / $anchor (local_refs)
# `$ref`s through `$id`, `$anchor` and relative URIs inside one document, made local.
#
# The builders resolve `#` and `#/json/pointer` references against the document root. A
# schema whose references go through base URIs (`$id`, draft 7's `"$id": "#name"`), anchors
# (`$anchor`, and `$dynamicAnchor`, which a plain `$ref` treats as an anchor) or relative URIs
# is rewritten first: every `$ref` that names a place in this document becomes the JSON pointer
# of that place from the root, and the identifiers are dropped (the rewritten document has one
# base, so the validator that checks enum values reads it the same way). References that
# name no place here (other documents, unknown anchors) are left as they are: the builders
# refuse them with UnsupportedSchemaError naming `$ref`. A `$dynamicRef` is a `$ref` when its
# anchor is the `$dynamicAnchor` of at most one schema here (dynamic scope then finds that
# one or none); with more, the document is expanded with its dynamic scope (`refs.dynamic`).
DEFAULT_BASE = "https://root.invalid/schema.json"  # the root's URI when it has no $id
_IDS = ("$id", "$anchor", "$dynamicAnchor")
# keywords whose value is a schema, a list of schemas, or a name -> schema map
_ONE = (
    "additionalProperties", "additionalItems", "unevaluatedProperties", "unevaluatedItems",
    "contains", "not", "if", "then", "else", "propertyNames", "contentSchema", "items",
)  # fmt: skip
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
        "dependencies")  # fmt: skip


def pointer_part(name: str) -> str:
    """One JSON pointer token (escaped; "%" encoded, as the resolver decodes it)."""
    return name.replace("~", "~0").replace("/", "~1").replace("%", "%25")


def subschemas(schema: dict) -> list[tuple[str, Any]]:
    """(pointer suffix, subschema) for each subschema directly under `schema`."""
    out: list[tuple[str, Any]] = []
    for key in _ONE:
        if isinstance(schema.get(key), dict | bool):
            out.append((f"/{pointer_part(key)}", schema[key]))
    for key in _LIST:
        if isinstance(schema.get(key), list):
            out += [(f"/{key}/{i}", s) for i, s in enumerate(schema[key])]
    for key in _MAP:
        if isinstance(schema.get(key), dict):
            out += [
                (f"/{pointer_part(key)}/{pointer_part(n)}", s)
                for n, s in schema[key].items()
                if isinstance(s, dict | bool)
            ]
    return out


def join(base: str, ref: str) -> str | None:
    """`ref` resolved against `base` (None where the base cannot take a relative URI)."""
    if ref.startswith("#"):
        return base.split("#", 1)[0] + ref
    if urlsplit(ref).scheme:
        return ref
    if urlsplit(base).scheme in uses_relative:
        return urljoin(base, ref)
    return None


def _needs_rewrite(root: Any) -> bool:
    """Whether some schema in the document (to depth 200) has an identifier, a `$ref` that
    is no root JSON pointer, or a `$dynamicRef`: one walk with a stack, over the
    subschemas `subschemas` lists, without their pointers."""
    todo: list[tuple[Any, int]] = [(root, 0)]
    while todo:
        schema, depth = todo.pop()
        if not isinstance(schema, dict) or depth > 200:
            continue
        for key in _IDS:
            if isinstance(schema.get(key), str):
                return True
        ref = schema.get("$ref")
        if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
            return True
        if "$dynamicRef" in schema:
            return True
        depth += 1
        for key in _ONE:
            if isinstance(schema.get(key), dict):
                todo.append((schema[key], depth))
        for key in _LIST:
            if isinstance(schema.get(key), list):
                todo += [(s, depth) for s in schema[key]]
        for key in _MAP:
            if isinstance(schema.get(key), dict):
                todo += [(s, depth) for s in schema[key].values()]
    return False


def local_refs(root: Any) -> Any:
    """`root` with its in-document references as root JSON pointers (see the module doc);
    `root` itself when it needs no rewriting."""
    if not _needs_rewrite(root):
        return root
    draft = root.get("$schema") if isinstance(root, dict) else None
    old = "draft-0" in str(draft or "")
    places: dict[str, str] = {}  # absolute URI (with fragment) -> pointer from the root
    bases: dict[int, str] = {}  # id(schema dict) -> its base URI
    dynamic: list[str] = []  # the $dynamicAnchor names, once per schema
    dynamic_refs: list[str] = []  # the anchor names $dynamicRefs name
    at_ptr: dict[str, Any] = {}  # pointer from the root -> the schema there

    def index(schema: Any, base: str, ptr: str, depth: int) -> None:
        if not isinstance(schema, dict) or depth > 200:
            return
        sid = schema.get("$id")
        if isinstance(sid, str) and "$ref" in schema and draft is None:
            # draft 7 ignores an $id beside $ref, 2019-09 on apply it: say which
            raise UnsupportedSchemaError(
                "$id", f"#{ptr}", "beside $ref in a schema without $schema"
            )
        if isinstance(sid, str) and not (old and "$ref" in schema):  # draft 7: $ref wins
            uri = join(base, sid)
            if uri is not None:
                whole, _, frag = uri.partition("#")
                if frag and not frag.startswith("/"):  # draft 7: "$id": "#name" names it
                    places.setdefault(f"{whole}#{frag}", ptr)
                base = whole
                places.setdefault(base, ptr)
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(schema.get(key), str):
                places.setdefault(f"{base}#{schema[key]}", ptr)
        if isinstance(schema.get("$dynamicAnchor"), str):
            dynamic.append(schema["$dynamicAnchor"])
        if isinstance(schema.get("$dynamicRef"), str):
            dynamic_refs.append(schema["$dynamicRef"].partition("#")[2])
        bases[id(schema)] = base
        at_ptr[ptr] = schema
        for suffix, sub in subschemas(schema):
            index(sub, base, ptr + suffix, depth + 1)

    def target(base: str, ref: str) -> str | None:
        uri = join(base, ref)
        if uri is None:
            return None
        whole, _, frag = uri.partition("#")
        if not frag or frag.startswith("/"):
            at = places.get(whole)
            return None if at is None else "#" + at + frag
        at = places.get(f"{whole}#{frag}")
        return None if at is None else "#" + at

    def rewrite(schema: Any, depth: int) -> Any:
        if not isinstance(schema, dict) or depth > 200:
            return schema
        out = {k: v for k, v in schema.items() if k not in _IDS}
        base = bases.get(id(schema), DEFAULT_BASE)
        if isinstance(schema.get("$ref"), str):
            local = target(base, schema["$ref"])
            if local is not None:
                out["$ref"] = local
        dref = schema.get("$dynamicRef")
        if isinstance(dref, str) and dynamic.count(dref.partition("#")[2]) <= 1:
            local = target(base, dref)
            if local is not None:
                del out["$dynamicRef"]
                if "$ref" in out:  # both apply
                    out["allOf"] = [*out.get("allOf", []), {"$ref": local}]
                else:
                    out["$ref"] = local
        for key in _ONE:
            if isinstance(schema.get(key), dict | bool):
                out[key] = rewrite(schema[key], depth + 1)
        for key in _LIST:
            if isinstance(schema.get(key), list):
                out[key] = [rewrite(s, depth + 1) for s in schema[key]]
        for key in _MAP:
            if isinstance(schema.get(key), dict):
                out[key] = {n: rewrite(s, depth + 1) for n, s in schema[key].items()}
        return out

    places[DEFAULT_BASE] = ""
    index(root, DEFAULT_BASE, "", 0)
    if not old and any(dynamic.count(name) > 1 for name in dynamic_refs):
        # several anchors of a $dynamicRef's name: which one depends on the dynamic scope
        return expand_dynamic(root, target, bases, at_ptr, (_ONE, _LIST, _MAP))
    return rewrite(root, 0)


def ptr_escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")


def pointer_target(root: Any, ref: str) -> Any:
    """What the local reference `ref` ("#" or "#/a/b", with ~0 / ~1 and %XX escapes) names in
    `root`; LookupError when nothing there has that path."""
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        if "~" in part:
            part = part.replace("~1", "/").replace("~0", "~")
        if "%" in part:
            part = _PERCENT.sub(lambda m: chr(int(m.group(1), 16)), part)
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise LookupError(ref)
    return node
