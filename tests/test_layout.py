"""The layout of the three packages (docs/ARCHITECTURE.md): no import cycle between modules
(imports inside functions count; only those under `if TYPE_CHECKING:` do not), each folder's
modules import only their own folder and the layers below it, folders of at most 14 modules,
files of at most 450 lines, and the public names where users import them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts.import_graph import cycles, folder_sizes, graph, long_files

REPO = Path(__file__).resolve().parents[1]

# bottom to top; a module belongs to the longest prefix listed
LAYERS = [
    ("grammar.errors",),
    ("grammar.automata",),
    ("grammar.tokens",),
    ("grammar.cfg",),
    ("grammar.json_schema",),
    ("grammar",),
    ("runtime.errors", "runtime.config"),
    ("runtime.kernels",),
    ("runtime.memory",),
    ("runtime.parallel",),
    ("runtime.models",),
    ("runtime.workers",),
    ("runtime.scheduling",),
    ("runtime.disaggregation",),
    ("runtime",),
    ("runtime.server",),
    ("runtime.cluster",),
]


def _layer(module: str) -> int | None:
    best, level = "", None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > len(best):
                best, level = p, i
    return level


def test_no_import_cycle_between_modules():
    assert cycles(graph()) == []


def test_cycle_detection_sees_an_import_inside_a_function(tmp_path):
    pkg = tmp_path / "grammar"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from grammar.b import x\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from grammar.a import y\n"
        "def f():\n    from grammar import a\n"
    )
    assert cycles(graph(tmp_path)) == [["grammar.a", "grammar.b"]]
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import grammar.a\n"
    )
    assert cycles(graph(tmp_path)) == []


def test_each_folder_imports_only_itself_and_the_layers_below():
    wrong = []
    for module, targets in graph().items():
        here = _layer(module)
        if here is None:  # sgl_dsl: cycles only
            continue
        for target in targets:
            there = _layer(target)
            if there is not None and there > here:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_folders_and_files_stay_small():
    assert {f: n for f, n in folder_sizes().items() if n > 14} == {}
    assert long_files(450) == {}


def test_public_names_import_from_where_they_did():
    code = """
from grammar import (TokenVocabulary, compile_json_schema, compile_regex, compile_choices,
    compile_lark, json_schema_to_regex, GrammarError, UnsupportedSchemaError)
from runtime import Engine
import sgl_dsl as sgl
for name in ("Runtime", "RuntimeEndpoint", "set_default_backend", "get_default_backend",
             "function", "gen", "select", "system", "user", "assistant"):
    assert hasattr(sgl, name), name
for name in ("generate", "score", "stats", "flush_cache", "shutdown"):
    assert callable(getattr(Engine, name)), name
for name in ("from_tokenizer",):
    assert hasattr(TokenVocabulary, name)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("module", ["runtime.server", "runtime.cluster", "runtime.kv_size"])
def test_command_line_entry_points_still_start(module):
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
