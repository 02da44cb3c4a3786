"""Which `$ref`s building a subschema may expand: what the schema builder's memo of built
values keys on besides the subschema (its language depends on how often each of those is
being expanded at the time, through the recursion cut, and on nothing else)."""

from __future__ import annotations

from typing import Any

from grammar.json_schema.refs.local import pointer_target

_UNSEEN, _MISSING = object(), object()


class RefReach:
    """The `$ref`s reachable from the subschemas of one document, memoised by object."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._reaches: dict[int, tuple[Any, frozenset[str]]] = {}
        self._closures: dict[str, frozenset[str]] = {}
        self._written: dict[int, tuple[Any, frozenset[str]]] = {}
        self._by_written: dict[frozenset[str], frozenset[str]] = {}
        self._targets: dict[str, Any] = {}

    def of(self, schema: Any) -> frozenset[str]:
        """Every `$ref` that building `schema` may expand: those written anywhere inside it,
        and those their targets reach (a superset: any keyword counts)."""
        hit = self._reaches.get(id(schema))
        if hit is not None and hit[0] is schema:
            return hit[1]
        direct = self.written(schema)
        out = self._by_written.get(direct)
        if out is None:  # (many subschemas write the same refs, most of them none)
            out = frozenset(direct.union(*(self.closure(r) for r in direct)))
            self._by_written[direct] = out
        self._reaches[id(schema)] = (schema, out)  # holding it keeps its id from reuse
        return out

    def closure(self, ref: str) -> frozenset[str]:
        """`ref` and every `$ref` its target reaches, transitively."""
        hit = self._closures.get(ref)
        if hit is not None:
            return hit
        seen, todo = {ref}, [ref]
        while todo:
            r = todo.pop()
            done = self._closures.get(r)
            if done is not None:  # already closed: no need to walk it again
                seen |= done
                continue
            try:
                target = self.target(r)
            except LookupError:
                continue  # (building it refuses the reference)
            for nxt in self.written(target):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        out = self._closures[ref] = frozenset(seen)
        return out

    def target(self, ref: str) -> Any:
        """What the local reference `ref` names in the document (local.pointer_target,
        once per reference); LookupError when nothing there has that path."""
        hit = self._targets.get(ref, _UNSEEN)
        if hit is _UNSEEN:
            try:
                hit = pointer_target(self.root, ref)
            except LookupError:
                hit = _MISSING
            self._targets[ref] = hit
        if hit is _MISSING:
            raise LookupError(ref)
        return hit

    def written(self, x: Any) -> frozenset[str]:
        """The `$ref` strings written inside a JSON value (not following them)."""
        if not isinstance(x, dict | list):
            return frozenset()
        hit = self._written.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
        found: set[str] = set()
        if isinstance(x, dict) and isinstance(x.get("$ref"), str):
            found.add(x["$ref"])
        for v in x.values() if isinstance(x, dict) else x:
            if isinstance(v, dict | list):
                found |= self.written(v)
        out = frozenset(found)
        self._written[id(x)] = (x, out)
        return out
