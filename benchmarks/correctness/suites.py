"""The schema sets the grammar engines' timings (`benchmarks.grammar.compare`) and the
correctness suites run, as one list of items each: the JSONSchemaBench sample (one schema per
file) and the official JSON-Schema-Test-Suite (one group per item), and the keywords each item
is counted under in the per-keyword table. The official suite's files and groups are read here,
scored as its README says (`scored_schema`)."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import shared_dir
from tests.support.schema_bench import bench_files, fixed_slice, load_case

DRAFTS = ("draft2020-12", "draft7")


def suite_dir() -> Path:
    return shared_dir() / "data" / "json-schema-test-suite"


NO_SUITE = f"JSON-Schema-Test-Suite not found at {suite_dir()} (set SGL_SHARED_DIR)"


def suite_files(only: str = "") -> list[str]:
    """The scored files: each draft's required tests, then its optional/format tests."""
    root = suite_dir() / "tests"
    files: list[str] = []
    for draft in DRAFTS:
        files += sorted(glob.glob(str(root / draft / "*.json")))
        files += sorted(glob.glob(str(root / draft / "optional" / "format" / "*.json")))
    return [f for f in files if only in os.path.relpath(f, root)]


def groups(files: list[str]) -> list[tuple[str, int, dict]]:
    """(file, index, group) for every group of the files."""
    out = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            for i, group in enumerate(json.load(f)):
                out.append((path, i, group))
    return out


DIALECTS = {"draft7": "http://json-schema.org/draft-07/schema#"}


def scored_schema(schema: Any, path: str = "") -> Any:
    """Bare boolean schemas count as {} / {"not": {}}. A group from the draft-7 folder (its
    file `path`) declares that dialect with `$schema`, as a validator is told its draft for
    the suite (the suite's schemas leave it out)."""
    if schema is True:
        schema = {}
    elif schema is False:
        return {"not": {}}
    draft = next((d for d in DIALECTS if d in Path(path).parts), None)
    if draft and isinstance(schema, dict) and "$schema" not in schema:
        return {"$schema": DIALECTS[draft], **schema}
    return schema


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
