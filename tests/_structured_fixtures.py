"""Constraints the structured-output tests share, and marks for grammar kinds a build may lack."""

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

# a GBNF grammar (several rules, alternation, a class, a bounded repeat) and the same language
# as a Python regex, to check outputs with `re`
GBNF = 'root ::= greeting " " name\ngreeting ::= "hi" | "hello"\nname ::= [A-Z] [a-z]{1,3}\n'
GBNF_AS_REGEX = r"(hi|hello) [A-Z][a-z]{1,3}"
LARK = 'start: ("hi" | "hello") " " /[A-Z][a-z]{1,3}/'
# a tag's content: short, so that tags fit in a few tokens
TAG_SCHEMA = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["x"],
}
