"""JSON instances as a schema-ordered generator writes them: compact, keys in the schema's
property order."""

from __future__ import annotations

import json
from typing import Any


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class SchemaOrder:
    """Orders an instance's keys as a schema-ordered generator emits them: a $ref target's and
    own `properties`, then each `allOf` branch, then the `anyOf` / `oneOf` branch the instance
    fits, then the other keys in instance order. Applied recursively to values."""

    def __init__(self, root: Any) -> None:
        import jsonschema

        self.root = root
        cls = jsonschema.validators.validator_for(root if isinstance(root, dict) else {})
        self.validator = cls(root if isinstance(root, dict | bool) else {})

    def deref(self, ref: str) -> Any:
        node = self.root
        for part in ref.lstrip("#").split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    def fits(self, schema: Any, instance: Any) -> bool:
        try:
            return self.validator.evolve(schema=schema).is_valid(instance)
        except Exception:
            return False

    def members(self, schema: Any, instance: dict, depth: int = 0) -> list[tuple[str, Any]]:
        if not isinstance(schema, dict) or depth > 30:
            return []
        out: list[tuple[str, Any]] = []
        if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
            try:
                out += self.members(self.deref(schema["$ref"]), instance, depth + 1)
            except (KeyError, IndexError, ValueError):
                pass
        out += list((schema.get("properties") or {}).items())
        for branch in schema.get("allOf", []):
            out += self.members(branch, instance, depth + 1)
        for kind in ("anyOf", "oneOf"):
            for branch in schema.get(kind, []):
                if self.fits(branch, instance):
                    out += self.members(branch, instance, depth + 1)
                    break
        return out

    def extra_schema(self, schema: Any, depth: int = 0) -> Any:
        """The schema of members outside `properties`: additionalProperties, through $ref
        and allOf (order() wraps a member's schemas in an allOf of its own)."""
        if not isinstance(schema, dict) or depth > 30:
            return True
        if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
            try:
                return self.extra_schema(self.deref(schema["$ref"]), depth + 1)
            except (KeyError, IndexError, ValueError):
                return True
        parts = [schema.get("additionalProperties", True)]
        parts += [self.extra_schema(b, depth + 1) for b in schema.get("allOf", [])]
        parts = [p for p in parts if p is not True and p != {}]
        return True if not parts else parts[0] if len(parts) == 1 else {"allOf": parts}

    def pattern_schema(self, schema: Any, key: str, depth: int = 0) -> Any:
        """The patternProperties schemas matching `key` (through $ref and allOf), or None."""
        import re

        if not isinstance(schema, dict) or depth > 30:
            return None
        if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
            try:
                return self.pattern_schema(self.deref(schema["$ref"]), key, depth + 1)
            except (KeyError, IndexError, ValueError):
                return None
        found = []
        for pattern, sub in (schema.get("patternProperties") or {}).items():
            try:
                if re.search(pattern, key):
                    found.append(sub)
            except re.error:
                continue
        found += [
            p for b in schema.get("allOf", []) if (p := self.pattern_schema(b, key, depth + 1))
        ]
        return None if not found else found[0] if len(found) == 1 else {"allOf": found}

    def order(self, schema: Any, instance: Any, depth: int = 0) -> Any:
        if depth > 60:
            return instance
        if isinstance(instance, dict):
            subs: dict[str, list[Any]] = {}
            for key, sub in self.members(schema, instance):
                if key in instance:
                    subs.setdefault(key, []).append(sub)
            extra = self.extra_schema(schema)
            out = {}
            for key in [*subs, *(k for k in instance if k not in subs)]:
                if key in subs:
                    sub = {"allOf": subs[key]}
                else:
                    sub = self.pattern_schema(schema, key) or extra
                out[key] = self.order(sub, instance[key], depth + 1)
            return out
        if isinstance(instance, list):
            return [
                self.order(self.item_schema(schema, i), v, depth + 1)
                for i, v in enumerate(instance)
            ]
        return instance

    def item_schema(self, schema: Any, i: int, depth: int = 0) -> Any:
        if not isinstance(schema, dict) or depth > 30:
            return True
        if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
            try:
                return self.item_schema(self.deref(schema["$ref"]), i, depth + 1)
            except (KeyError, IndexError, ValueError):
                return True
        parts = [self.item_schema(b, i, depth + 1) for b in schema.get("allOf", [])]
        prefix = schema.get("prefixItems")
        items = schema.get("items", True)
        if prefix is not None:
            own = prefix[i] if i < len(prefix) else items
        elif isinstance(items, list):
            own = items[i] if i < len(items) else schema.get("additionalItems", True)
        else:
            own = items
        branches = [
            self.item_schema(b, i, depth + 1) for k in ("anyOf", "oneOf") for b in schema.get(k, [])
        ]
        return {"allOf": [own, *parts], "anyOf": branches} if branches else {"allOf": [own, *parts]}


def serialise(schema: Any, instance: Any) -> str:
    """Compact JSON in the schema's property order; references through `$id` / `$anchor`
    are followed as the engine follows them (made root JSON pointers first)."""
    from grammar.errors import GrammarError
    from grammar.json_schema.merge import local_refs

    try:
        schema = local_refs(schema)
    except GrammarError:
        pass  # an $id the engine refuses: order by the schema as written
    return compact(SchemaOrder(schema).order(schema, instance))
