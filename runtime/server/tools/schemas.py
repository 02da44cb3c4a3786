"""A tool's parameter schema placed inside a larger schema, its local `$ref`s kept working.

pydantic (and most users) write a model that holds another model with `$defs` and
`"$ref": "#/$defs/Person"`; the pointer is relative to the parameters' own root. A call
schema (`{"name": ..., "arguments": <parameters>}`) or one keyword argument (the `pythonic`
format) moves those parameters away from the root, so the pointer would no longer resolve.
`embedded` gives each tool's parameters their own base URI (`$id`, JSON Schema's way of making
a subschema a document of its own): `#/$defs/...` inside them then resolves inside them, and
two tools whose definitions share a name but differ each keep their own.

`local_pointers` then writes those references as JSON pointers from the new root (what strict
mode reads to close the objects they name). `is_recursive` says whether the parameters refer to
themselves (a tree of nodes): the regex path unrolls such a schema to a depth, the context-free
path (`json_schema_to_lark`) says it exactly.
"""

from __future__ import annotations

import functools
import json
from typing import Any

# the base URI each tool's parameters get inside a call schema (the tool's name appended:
# names are unique in a request, and their characters are all allowed in a URN)
TOOL_BASE = "urn:sgl-tool:"


def tool_base(name: str) -> str:
    return f"{TOOL_BASE}{name}"


def embedded(params: dict[str, Any], name: str) -> dict[str, Any]:
    """`params` as a subschema of another document, its local `$ref`s resolving inside it
    (parameters that name their own `$id` keep it; a root that is only a `$ref` into its
    `$defs`, pydantic's recursive model, is read as the definition it names: an `$id` beside
    a `$ref` is refused in drafts before 2019-09)."""
    from grammar.structural.xml_args import root_object

    params = root_object(params)
    if "$id" in params or not _has_ref(params):
        return params
    return {"$id": tool_base(name), **params}


def property_schema(params: dict[str, Any], prop: str, name: str) -> Any:
    """The schema of property `prop` of tool `name`'s `params` as a document of its own: a
    `$ref` to it inside the embedded parameters, so the property's own `$ref`s still resolve."""
    value = (params.get("properties") or {}).get(prop, True)
    if not _has_ref(value):
        return value
    from grammar.json_schema.refs.local import pointer_part

    inner = embedded(params, name)
    base = str(inner.get("$id", tool_base(name))).split("#", 1)[0]
    doc = {"$defs": {"parameters": inner}, "$ref": f"{base}#/properties/{pointer_part(prop)}"}
    return local_pointers(doc)


def local_pointers(schema: Any) -> Any:
    """`schema` with every `$ref` through a base URI (`$id`) written as a JSON pointer from
    its root: the same language, in the form strict mode (`grammar.json_schema.strict`)
    follows when it closes the objects a `$ref` names."""
    if not _has_ref(schema):
        return schema
    from grammar import GrammarError
    from grammar.json_schema.refs.local import local_refs

    try:
        return local_refs(schema)
    except GrammarError:
        return schema  # refused, with the keyword named, where the schema is compiled


def is_recursive(params: dict[str, Any]) -> bool:
    """Whether some `$ref` of `params` can reach itself again (a recursive schema)."""
    if not _has_ref(params):
        return False
    from grammar import GrammarError
    from grammar.json_schema.refs.local import local_refs, pointer_target
    from grammar.json_schema.refs.reach import RefReach
    from grammar.json_schema.schema import load_schema

    try:
        root = local_refs(load_schema(params))
    except (GrammarError, ValueError, TypeError):
        return False  # refused where the schema is checked, with the keyword named
    reach = RefReach(root)
    for ref in reach.of(root):
        try:
            target = pointer_target(root, ref)
        except (GrammarError, LookupError, ValueError, TypeError):
            continue
        if ref in reach.of(target):
            return True
    return False


def recursive_params(params: Any) -> bool:
    """`is_recursive`, cached by the schema's JSON text (an agent sends the same tools with
    every turn)."""
    if not _has_ref(params):
        return False
    return _recursive_text(json.dumps(params, sort_keys=True))


@functools.lru_cache(maxsize=256)
def _recursive_text(text: str) -> bool:
    return is_recursive(json.loads(text))


def _has_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        return (
            "$ref" in schema or "$dynamicRef" in schema or any(_has_ref(v) for v in schema.values())
        )
    if isinstance(schema, list):
        return any(_has_ref(v) for v in schema)
    return False
