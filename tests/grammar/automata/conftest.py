"""Fixtures of the automata tests: the lazy DFA's two subset constructions."""

from __future__ import annotations

import pytest

from grammar import clear_caches


@pytest.fixture(params=["c", "python"])
def subset_construction(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with the lazy DFA built by the C core (`native_dfa`) and by the Python
    construction (SGL_GRAMMAR_NATIVE=0: what a machine without a compiler runs). Compiled
    grammars are cached across both: the caches are cleared first."""
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "1" if request.param == "c" else "0")
    clear_caches()
    return request.param
