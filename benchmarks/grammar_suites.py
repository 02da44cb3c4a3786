"""The schema sets `benchmarks.grammar` runs, as one list of items each: the JSONSchemaBench
sample (one schema per file) and the official JSON-Schema-Test-Suite (one group per item), and
the keywords each item is counted under in the per-keyword table."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tests._grammar_fixtures import bench_files, fixed_slice, load_case

SUITES = ("jsonschemabench", "json-schema-test-suite")
# the keywords the per-keyword table of JSONSchemaBench counts (a schema counts under each one
# it uses anywhere)
KEYWORDS = (
    "$ref", "$defs", "definitions", "$id", "$anchor", "$dynamicRef", "additionalItems",
    "additionalProperties", "allOf", "anyOf", "const", "contains", "dependencies",
    "dependentRequired", "dependentSchemas", "else", "enum", "exclusiveMaximum",
    "exclusiveMinimum", "format", "if", "items", "maxItems", "maxLength", "maxProperties",
    "maximum", "minItems", "minLength", "minProperties", "minimum", "multipleOf", "not",
    "oneOf", "pattern", "patternProperties", "prefixItems", "properties", "propertyNames",
    "required", "then", "type", "unevaluatedItems", "unevaluatedProperties", "uniqueItems",
)  # fmt: skip
_NAMED = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
_DATA = {"enum", "const", "default", "examples", "required", "dependentRequired"}


@dataclass(slots=True)
class Item:
    label: str
    keywords: list[str]
    schema: Any
    tests: list[tuple[Any, bool]]  # (instance, valid)


def schema_keywords(schema: Any, out: set[str] | None = None) -> set[str]:
    """The KEYWORDS used anywhere in `schema` (names under `properties` etc. are not)."""
    out = set() if out is None else out
    if isinstance(schema, list):
        for sub in schema:
            schema_keywords(sub, out)
    elif isinstance(schema, dict):
        for key, value in schema.items():
            if key in KEYWORDS:
                out.add(key)
            if key in _DATA:
                continue
            if key in _NAMED and isinstance(value, dict):
                for sub in value.values():
                    schema_keywords(sub, out)
            elif isinstance(value, dict | list):
                schema_keywords(value, out)
    return out


def bench_items(limit: int = 0) -> list[Item]:
    """The JSONSchemaBench sample (the first `limit` of a fixed spread, or all)."""
    files = bench_files()
    files = fixed_slice(limit, files) if limit else files
    out = []
    for path in files:
        case = load_case(path)
        out.append(Item(case.name, sorted(schema_keywords(case.schema)), case.schema, case.tests))
    return out


def official_items(limit: int = 0) -> list[Item]:
    """The official suite's groups (both drafts, required tests and optional/format), each
    counted under its file's keyword (`format/<name>` for optional/format)."""
    from benchmarks.conformance import groups, scored_schema, suite_dir, suite_files

    root = suite_dir() / "tests"
    out = []
    for path, i, group in groups(suite_files()):
        rel = os.path.relpath(path, root)
        stem = os.path.splitext(os.path.basename(path))[0]
        keyword = f"format/{stem}" if "optional" in rel else stem
        tests = [(t["data"], bool(t["valid"])) for t in group["tests"]]
        out.append(Item(f"{rel}#{i}", [keyword], scored_schema(group["schema"], path), tests))
    if limit:
        step = max(1, len(out) // limit)
        out = out[::step][:limit]
    return out
