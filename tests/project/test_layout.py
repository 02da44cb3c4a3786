"""The layout of the three packages (docs/ARCHITECTURE.md): no import cycle between modules
(imports inside functions and under `if TYPE_CHECKING:` count), each folder's modules import
only their own folder and the layers below it, no function over 120 lines, the environment read
only in each package's `settings.py`, every module named in docs/ARCHITECTURE.md, no model file
importing an attention kernel, no tracker numbers, and the public names where users import
them. Files are split by concept, not by size: past ~600 lines a file only gets a warning."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from scripts.import_graph import (
    BENCHMARKS,
    cycles,
    env_reads,
    graph,
    long_files,
    long_functions,
    unnamed_modules,
)
from tests.support.paths import REPO

# bottom to top; a module belongs to the longest prefix listed
LAYERS = [
    ("grammar.errors", "grammar.settings", "grammar.native_build"),
    ("grammar.automata",),
    ("grammar.tokens",),
    ("grammar.cfg",),
    ("grammar.json_schema",),
    ("grammar.ebnf",),
    ("grammar.structural",),
    ("grammar",),
    ("runtime.errors", "runtime.config", "runtime.settings"),
    ("runtime.kernels",),
    ("runtime.memory",),
    ("runtime.attention",),
    ("runtime.parallel",),
    ("runtime.models",),
    ("runtime.device",),
    ("runtime.options",),
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


def test_scheduling_modules_import_one_another_without_a_circle():
    assert [comp for comp in cycles(graph()) if comp[0].startswith("runtime.scheduling.")] == []


def test_cycle_detection_sees_imports_inside_functions_and_under_type_checking(tmp_path):
    pkg = tmp_path / "grammar"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from grammar.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from grammar import a\n")
    assert cycles(graph(tmp_path)) == [["grammar.a", "grammar.b"]]
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import grammar.a\n"
    )
    assert cycles(graph(tmp_path)) == [["grammar.a", "grammar.b"]]
    (pkg / "b.py").write_text("x = 1\n")
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


def test_no_function_is_longer_than_120_lines():
    assert long_functions(120) == {}


def test_long_function_scan_counts_methods_and_nested_functions(tmp_path):
    pkg = tmp_path / "runtime"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(130))
    (pkg / "a.py").write_text(
        f"class C:\n    def m(self):\n{body.replace('    ', '        ')}"
        f"def short():\n    def inner():\n{body.replace('    ', '        ')}"
    )
    assert long_functions(120, tmp_path) == {
        "runtime.a:C.m": 131,
        "runtime.a:short": 132,
        "runtime.a:short.inner": 131,
    }


def test_only_settings_modules_read_the_environment():
    assert env_reads() == {}


def test_environment_scan_sees_every_spelling(tmp_path):
    pkg = tmp_path / "grammar"
    pkg.mkdir()
    (pkg / "settings.py").write_text("import os\nA = os.environ.get('A')\n")
    (pkg / "a.py").write_text("import os\nA = os.getenv('A')\n")
    (pkg / "b.py").write_text("from os import environ\nB = environ['B']\n")
    (pkg / "c.py").write_text("import os\nP = os.path.join('a', 'b')\n")
    assert env_reads(tmp_path) == {"grammar.a": [2], "grammar.b": [1]}


def test_every_module_is_named_in_the_architecture_page():
    assert unnamed_modules() == []


def test_module_names_are_read_from_code_spans_only(tmp_path):
    (tmp_path / "docs").mkdir()
    pkg = tmp_path / "sgl_dsl"
    (pkg / "backend").mkdir(parents=True)
    for name in ("__init__.py", "ir.py", "tracer.py", "backend/__init__.py", "backend/base.py"):
        (pkg / name).write_text("")
    (tmp_path / "docs" / "ARCHITECTURE.md").write_text("`ir` and tracer; `backend/base.py`\n")
    assert unnamed_modules(tmp_path) == ["sgl_dsl.tracer"]


# the kernels an attention backend (runtime/attention/) chooses among; cpu.fused / cpu.gemv also
# hold the projection and norm kernels every model layer calls
ATTENTION_KERNELS = {
    f"runtime.kernels.{name}"
    for name in ("reference", "triton.attention", "triton.mla", "cascade", "short_extend",
                 "decode_plan", "prefix_extend")
}  # fmt: skip


def test_the_attention_kernel_list_names_real_modules():
    assert ATTENTION_KERNELS <= set(graph())


def test_no_import_cycle_in_the_benchmarks():
    assert cycles(graph(packages=BENCHMARKS)) == []


# the device tool's entry point stays where the team's guide names it
TOP_LEVEL_FILES = {"__init__.py", "conftest.py", "gpu_check.sh"}


def test_tests_and_benchmarks_keep_only_packages_at_their_top():
    loose = [
        f"{folder}/{path.name}"
        for folder in ("tests", "benchmarks")
        for path in sorted((REPO / folder).iterdir())
        if path.is_file() and path.name not in TOP_LEVEL_FILES
    ]
    assert loose == []


def test_every_test_file_sits_in_a_package_folder():
    loose = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "tests").rglob("test_*.py"))
        if not (path.parent / "__init__.py").exists()
    ]
    assert loose == []


def test_model_files_import_no_attention_kernel():
    wrong = {
        module: sorted(targets & ATTENTION_KERNELS)
        for module, targets in graph().items()
        if module.startswith("runtime.models.") and targets & ATTENTION_KERNELS
    }
    assert wrong == {}


# `issue 12`, `(issue 4)`, `issue #4`: the tracker's numbering means nothing to a reader
TRACKER_NUMBER = re.compile(r"\bissues? #?[0-9]+\b", re.IGNORECASE)


def test_no_tracker_numbers_in_code_tests_or_docs():
    here = Path(__file__).resolve()
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for folder in ("grammar", "runtime", "sgl_dsl", "tests", "benchmarks", "scripts", "examples"):
        files += sorted((REPO / folder).rglob("*.py")) + sorted((REPO / folder).rglob("*.sh"))
    found = {
        str(path.relative_to(REPO)): TRACKER_NUMBER.findall(path.read_text(encoding="utf-8"))
        for path in files
        if path != here and TRACKER_NUMBER.search(path.read_text(encoding="utf-8"))
    }
    assert found == {}


def test_readme_is_a_front_door_and_doc_links_resolve():
    readme = REPO / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 300  # depth lives in docs/
    broken = []
    for page in [readme, *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert broken == []


def test_long_files_are_only_reported():
    long = long_files(600)
    if long:  # a prompt to check the file is still one concept, not a failure
        warnings.warn(f"files past 600 lines: {long}", stacklevel=1)


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
