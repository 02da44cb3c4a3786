"""The C sources of the native libraries (grammar/tokens/csrc/, grammar/automata/csrc/,
runtime/kernels/cpu/csrc/): every unit each library builds compiles cleanly with warnings as
errors, a build's cache key covers every header beside its source, and no C is kept in a Python
string."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from grammar import native_build
from grammar.automata import native_dfa
from grammar.tokens import native
from runtime.kernels.cpu import fused, quant

REPO = Path(__file__).resolve().parents[3]


def _retarget(unit: native_build.Unit, old: str, *new: str) -> native_build.Unit:
    """`unit` with its flag `old` replaced by `new` (another CPU's branches of the same C)."""
    flags = tuple(f for flag in unit.flags for f in ((*new,) if flag == old else (flag,)))
    return dataclasses.replace(unit, flags=flags)


# every unit a library builds, as "<library>/<unit>"; then the SIMD branches another CPU takes
UNITS = {
    **{f"grammar-trie/{u.name}": u for u in native.UNITS},
    **{f"grammar-subset/{u.name}": u for u in native_dfa.UNITS},
    **{f"fused{'-omp' if omp else ''}/{u.name}": u for omp in (True, False)
       for u in fused.units(omp)},
    **{f"fused8{'-omp' if omp else ''}/{u.name}": u for omp in (True, False)
       for u in fused.fp8_units(omp)},
    **{f"quant{'-portable' if p else ''}/{u.name}": u for p in (False, True)
       for u in quant.units(p)},
    "fused-omp/gemv without AVX-512 BF16": _retarget(
        fused.units(True)[2], "-march=native", "-march=native", "-mno-avx512bf16"
    ),
    "quant/avx2": _retarget(quant.units()[0], "-march=native", "-march=haswell"),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(UNITS))
def test_each_unit_compiles_without_warnings(name):
    if native_build.compiler() is None:
        pytest.skip("no C compiler")
    assert native_build.compile_warnings([UNITS[name]]) == {}


def test_a_build_is_keyed_by_every_header_beside_its_source(monkeypatch, tmp_path):
    if native_build.compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("SGL_NATIVE_CACHE", str(tmp_path / "cache"))
    (src := tmp_path / "csrc").mkdir()
    (src / "a.c").write_text('#include "a.h"\nint f(void) { return A; }\n')
    (src / "a.h").write_text("#define A 1\n")
    unit = native_build.Unit("a", src / "a.c", ("-O1", "-fPIC"))
    assert native_build.load_library("t", [unit]).f() == 1
    (src / "a.h").write_text("#define A 2\n")
    assert native_build.load_library("t", [unit]).f() == 2
    assert len(list((tmp_path / "cache").glob("t-*.so"))) == 2


def test_signatures_are_applied_when_a_library_loads(monkeypatch, tmp_path):
    if native_build.compiler() is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("SGL_NATIVE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "half.c").write_text("double half(double x) { return x / 2; }\n")
    unit = native_build.Unit("half", tmp_path / "half.c", ("-O1", "-fPIC"))
    signatures = {"half": (native_build.ctypes.c_double, [native_build.ctypes.c_double])}
    assert native_build.load_library("h", [unit], signatures=signatures).half(3.0) == 1.5


def test_no_c_source_is_kept_in_a_python_string():
    found = [
        str(path.relative_to(REPO))
        for folder in ("grammar", "runtime", "sgl_dsl")
        for path in sorted((REPO / folder).rglob("*.py"))
        if re.search(r"^\s*#\s*include\s*[<\"]", path.read_text(encoding="utf-8"), re.MULTILINE)
    ]
    assert found == []
