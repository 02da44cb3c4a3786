"""The one module that names interegular's internals.

The regex front end (`regex_ast`, `pattern`, `ecma_regex`, `nfa`, `nfa_keys`) builds and walks
interegular's parse trees, whose node classes are private (`_CharGroup`, `_Concatenation`,
`_Repeated`, ...). They are given public names here, so a new interegular version that renames
or reshapes them is handled in this file (the version is pinned in pyproject.toml). Import it as
`from grammar.automata import interegular_adapter as ip`.
"""

from __future__ import annotations

from interegular import patterns as _patterns
from interegular.utils.simple_parser import nomatch

# public in interegular
Pattern = _patterns.Pattern
InvalidSyntax = _patterns.InvalidSyntax
Unsupported = _patterns.Unsupported
parse_pattern = _patterns.parse_pattern
REFlags = _patterns.REFlags
# private in interegular: the parse tree's node classes, the parser, and two shared nodes
CharGroup = _patterns._CharGroup
Concatenation = _patterns._Concatenation
Repeated = _patterns._Repeated
NonCapturing = _patterns._NonCapturing
ParsePattern = _patterns._ParsePattern
DOT = _patterns._DOT  # `.`: any character but a line break
EMPTY = _patterns._EMPTY  # the empty string

__all__ = [
    "DOT",
    "EMPTY",
    "CharGroup",
    "Concatenation",
    "InvalidSyntax",
    "NonCapturing",
    "ParsePattern",
    "Pattern",
    "REFlags",
    "Repeated",
    "Unsupported",
    "nomatch",
    "parse_pattern",
]
