"""Environment variables: one declaration each in a package's settings.py, read there, parsed
strictly, listed in docs/configuration.md; the shared native-build helper's lookups."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from grammar import native_build
from grammar.settings import Choice, Flag, Folder, SettingError, Text
from scripts.settings_doc import PAGE, blocks, render

PACKAGES = ("grammar", "runtime", "sgl_dsl")


def _declared():
    return [s for pkg in PACKAGES for s in importlib.import_module(f"{pkg}.settings").SETTINGS]


def test_configuration_page_is_generated_from_the_settings():
    text = PAGE.read_text(encoding="utf-8")
    assert blocks(text) == list(PACKAGES)
    assert render(text) == text, "run python scripts/settings_doc.py"


def test_every_variable_is_declared_once_and_documented():
    names = [s.name for s in _declared()]
    assert len(names) == len(set(names))
    for s in _declared():
        assert s.doc.strip() and s.doc.rstrip().endswith("."), s.name


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param(None, True, id="unset-default"),
        pytest.param("", True, id="empty-default"),
        pytest.param("  ", True, id="blank-default"),
        pytest.param("0", False, id="zero"),
        pytest.param("1", True, id="one"),
        pytest.param(" OFF ", False, id="off-any-case"),
        pytest.param("true", True, id="true"),
        pytest.param("no", False, id="no"),
    ],
)
def test_flag_values(monkeypatch, text, want):
    flag = Flag("SGL_TEST_FLAG", True, "A test flag.")
    if text is None:
        monkeypatch.delenv(flag.name, raising=False)
    else:
        monkeypatch.setenv(flag.name, text)
    assert flag.get() is want


def test_a_value_of_the_wrong_form_names_the_variable(monkeypatch):
    monkeypatch.setenv("SGL_TEST_FLAG", "2")
    with pytest.raises(SettingError, match="SGL_TEST_FLAG"):
        Flag("SGL_TEST_FLAG", True, "A test flag.").get()
    choice = Choice("SGL_TEST_CHOICE", "auto", "A test choice.", choices=("auto", "torch"))
    monkeypatch.setenv(choice.name, "Torch")
    assert choice.get() == "torch"
    monkeypatch.setenv(choice.name, "cuda")
    with pytest.raises(ValueError, match="SGL_TEST_CHOICE must be one of auto, torch"):
        choice.get()


def test_text_and_folder_values(monkeypatch, tmp_path):
    text = Text("SGL_TEST_TEXT", None, "A test text.")
    monkeypatch.delenv(text.name, raising=False)
    assert text.get() is None
    monkeypatch.setenv(text.name, " cc-13 ")
    assert text.get() == "cc-13"
    folder = Folder("SGL_TEST_FOLDER", Path("~/x"), "A test folder.")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(folder.name, raising=False)
    assert folder.get() == tmp_path / "x"
    monkeypatch.setenv(folder.name, "~/y")
    assert folder.get() == tmp_path / "y"


def test_runtime_switches_are_read_when_asked(monkeypatch):
    from runtime.engine import overlap_wanted

    monkeypatch.setenv("SGL_OVERLAP", "1")
    assert overlap_wanted(None) is True
    assert overlap_wanted(False) is False
    monkeypatch.setenv("SGL_OVERLAP", "0")
    assert overlap_wanted(None) is False


def test_native_build_finds_the_compiler_and_keys_builds_by_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("SGL_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "/opt/my-cc")
    assert native_build.compiler() == "/opt/my-cc"
    assert native_build.cache_dir() == tmp_path / "cache" and (tmp_path / "cache").is_dir()
    (tmp_path / "a.c").write_text("int f(void) { return 1; }\n")
    unit = native_build.Unit("a", tmp_path / "a.c", ("-O2", "-fPIC"))
    other = native_build.Unit("a", unit.source, ("-O3", "-fPIC"))
    one = native_build.library_path("t", [unit], (), "cc")
    assert one.parent == tmp_path / "cache" and one.name.startswith("t-")
    assert one == native_build.library_path("t", [unit], (), "cc")
    assert one != native_build.library_path("t", [other], (), "cc")
    assert one != native_build.library_path("t", [unit], ("-lm",), "cc")
    assert one != native_build.library_path("t", [unit], (), "gcc")


def test_native_build_without_a_compiler_raises_a_typed_error(monkeypatch, tmp_path):
    monkeypatch.setenv("SGL_NATIVE_CACHE", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native_build.shutil, "which", lambda name: None)
    (tmp_path / "a.c").write_text("int f(void) { return 1; }\n")
    unit = native_build.Unit("a", tmp_path / "a.c", ("-fPIC",))
    with pytest.raises(native_build.NativeBuildError, match="no C compiler"):
        native_build.load_library("t", [unit])


def test_native_build_compiles_links_and_loads_once(monkeypatch, tmp_path):
    if native_build.compiler() is None:
        pytest.skip("no C compiler on this machine")
    monkeypatch.setenv("SGL_NATIVE_CACHE", str(tmp_path))
    (src := tmp_path / "csrc").mkdir()
    (src / "a.c").write_text("int twice(int x);\nint f(int x) { return twice(x) + 1; }\n")
    (src / "b.c").write_text("int twice(int x) { return 2 * x; }\n")
    units = [
        native_build.Unit("a", src / "a.c", ("-O1", "-fPIC")),
        native_build.Unit("b", src / "b.c", ("-O1", "-fPIC")),
    ]
    lib = native_build.load_library("t", units)
    assert lib.f(20) == 41
    built = list(tmp_path.glob("t-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    assert native_build.load_library("t", units).f(1) == 3
    assert built[0].stat().st_mtime_ns == stamp  # the cached file, not a rebuild
