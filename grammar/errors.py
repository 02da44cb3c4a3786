"""Typed errors of the grammar package."""

from __future__ import annotations


class GrammarError(ValueError):
    """A constraint that cannot be compiled or a token/byte the constraint forbids."""


class EmptyLanguageError(GrammarError):
    """A constraint no text satisfies (a JSON Schema that admits no instance: `false`,
    `not: {}`, an empty `enum`, ...). `compile_json_schema` compiles such a schema into a
    constraint that refuses every token (`CompiledGrammar.admits_nothing`); the runtime ends
    a request made with one with this error."""


class UnsupportedSchemaError(GrammarError):
    """A JSON Schema keyword that cannot be honoured exactly.

    Raised instead of silently ignoring a constraint, so that no invalid instance is
    ever accepted. ``keyword`` and ``pointer`` (a JSON pointer into the schema) say where.
    """

    def __init__(self, keyword: str, pointer: str, detail: str = "") -> None:
        self.keyword = keyword
        self.pointer = pointer or "#"
        msg = f"unsupported JSON Schema keyword {keyword!r} at {self.pointer}"
        super().__init__(f"{msg}: {detail}" if detail else msg)
