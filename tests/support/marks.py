"""Marks for the constraint kinds a build of `grammar` may lack (the structured-output tests)."""

from __future__ import annotations

import pytest

import grammar

needs_ebnf = pytest.mark.skipif(
    not hasattr(grammar, "compile_ebnf"), reason="grammar.compile_ebnf is not in this build"
)
needs_tags = pytest.mark.skipif(
    not hasattr(grammar, "compile_structural_tag"),
    reason="grammar.compile_structural_tag is not in this build",
)
