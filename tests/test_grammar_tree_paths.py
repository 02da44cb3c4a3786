"""The faster paths of the schema -> regex tree phase (json_schema_to_node) must build the
same language as the slower ones they stand in for, and a schema's compile must not pay a
library import that a long-running process pays once."""

from __future__ import annotations

import subprocess
import sys


def test_an_enum_check_imports_no_module_at_compile_time():
    # the enum values are checked against the rest of the schema by the jsonschema library
    code = (
        "import sys, grammar\n"
        "from grammar.json_schema.schema import json_schema_to_node\n"
        "before = set(sys.modules)\n"
        "json_schema_to_node({'type': 'integer', 'minimum': 2, 'enum': [1, 2, 3]})\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
