"""`Constraint`: one request's output constraint as a value, built once where the request enters.

Every front end names a constraint with one of the keywords in `KINDS` plus two options
(`OPTION_KEYS`): the engine's `generate(regex=..., json_schema=..., ...)`, the server's
`/generate` and `/v1` fields (mapped to those keywords by `runtime.server.structured`), the
DSL's `gen(...)` and the compile worker's job messages. Each builds a `Constraint` with
`Constraint.from_fields` (or `from_kwargs` over a keyword dict), which checks what can be
checked without compiling: at most one kind (a `ConstraintError` naming both fields), a
`dtype` name, the `json_schema_mode`, a structural tag's JSON text. The value is normalised
(a schema as its dict, a structural tag as its dict, choices as a tuple, a dtype as its name)
and options that do not apply to a kind are dropped, so the same constraint sent through any
entry point is the same value, with the same `key` for the one compile cache
(`grammar.compile`).

A `Constraint` crosses to the compile worker as `wire()` (strings and numbers only) and comes
back with `from_wire`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grammar.automata.fsm import DEFAULT_MAX_STATES
from grammar.errors import GrammarError
from grammar.json_schema.schema import ANY_DEPTH, DTYPE_NAMES, load_schema
from grammar.json_schema.strict import JSON_SCHEMA_MODES

# the constraint keywords of every entry point, in the order a conflict names them
KINDS = ("regex", "json_schema", "choices", "dtype", "grammar", "ebnf", "structural_tag")
# kinds whose value is JSON data (sent to the compile worker as JSON text)
JSON_KINDS = ("json_schema", "choices", "structural_tag")
# kinds that contain JSON Schemas: the only ones the mode and the whitespace apply to
SCHEMA_KINDS = ("json_schema", "structural_tag")
# keywords that tune a constraint (never one on their own)
OPTION_KEYS = ("json_schema_mode", "whitespace_pattern")
FIELDS = (*KINDS, *OPTION_KEYS)
DEFAULT_MODE = "strict"
# the start rule of the grammar kinds when none is named
_DEFAULT_START = {"grammar": "start", "ebnf": "root"}


class ConstraintError(GrammarError):
    """A constraint the request states wrongly (two kinds at once, an unknown dtype or mode,
    a structural tag that is not JSON); `field` names the keyword (the first, for two)."""

    def __init__(self, message: str, field: str) -> None:
        self.field = field
        super().__init__(message)


def given_kinds(fields: Mapping[str, Any]) -> list[str]:
    """The constraint keywords in `fields` that carry a value (None is no value)."""
    return [k for k in KINDS if fields.get(k) is not None]


@dataclass(frozen=True, eq=False)
class Constraint:
    """One output constraint. Compare and hash by `key`; build with `of` / `from_fields`."""

    kind: str
    value: Any  # normalised: str, a schema / tag dict (or bool schema), a tuple of choices
    json_schema_mode: str | None = None  # SCHEMA_KINDS only
    whitespace: str | None = None  # SCHEMA_KINDS only: the pattern between JSON tokens
    max_states: int = DEFAULT_MAX_STATES  # the automaton's state budget
    start: str | None = None  # the start rule of a lark / GBNF grammar
    # json_schema only: how deep a recursive `$ref` / an unconstrained value is unrolled
    max_recursion_depth: int = 3
    any_depth: int = ANY_DEPTH
    key: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind in JSON_KINDS:
            data = list(self.value) if self.kind == "choices" else self.value
            try:
                # keys in their order: a schema's property order is its output's order
                text = json.dumps(data, ensure_ascii=False)
            except (TypeError, ValueError) as exc:
                raise ConstraintError(f"{self.kind}: not JSON data: {exc}", self.kind) from None
        else:
            text = self.value
        key = (self.kind, text, self.json_schema_mode, self.whitespace, self.max_states,
               self.start, self.max_recursion_depth, self.any_depth)  # fmt: skip
        object.__setattr__(self, "key", key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Constraint) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def text(self) -> str:
        """The value as text (JSON text for `JSON_KINDS`)."""
        return self.key[1]

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def of(
        cls,
        kind: str,
        value: Any,
        *,
        json_schema_mode: str | None = None,
        whitespace_pattern: str | None = None,
        default_mode: str = DEFAULT_MODE,
        max_states: int = DEFAULT_MAX_STATES,
        start: str | None = None,
        max_recursion_depth: int = 3,
        any_depth: int = ANY_DEPTH,
    ) -> Constraint:
        """One constraint of `kind` (one of `KINDS`), checked and normalised. The mode is
        checked for every kind (a request may not name an unknown one) but kept only where it
        applies; `default_mode` is the entry point's default (the engine's, the server's)."""
        if kind not in KINDS:
            raise ConstraintError(f"unknown constraint kind {kind!r}; one of {list(KINDS)}", kind)
        mode = json_schema_mode if json_schema_mode is not None else default_mode
        if mode not in JSON_SCHEMA_MODES:
            msg = f"json_schema_mode must be one of {list(JSON_SCHEMA_MODES)}, got {mode!r}"
            raise ConstraintError(msg, "json_schema_mode")
        if whitespace_pattern is not None and not isinstance(whitespace_pattern, str):
            raise ConstraintError("whitespace_pattern must be a regex string", "whitespace_pattern")
        value = _normalise(kind, value)
        if kind not in SCHEMA_KINDS:
            mode, whitespace_pattern = None, None
        if kind in _DEFAULT_START:
            start = start or _DEFAULT_START[kind]
        else:
            start = None
        if kind != "json_schema":
            max_recursion_depth, any_depth = 3, ANY_DEPTH
        return cls(kind, value, mode, whitespace_pattern, max_states, start,
                   max_recursion_depth, any_depth)  # fmt: skip

    @classmethod
    def from_fields(
        cls,
        *,
        regex: str | None = None,
        json_schema: Any = None,
        choices: Any = None,
        dtype: Any = None,
        grammar: str | None = None,
        ebnf: str | None = None,
        structural_tag: Any = None,
        json_schema_mode: str | None = None,
        whitespace_pattern: str | None = None,
        default_mode: str = DEFAULT_MODE,
    ) -> Constraint | None:
        """The constraint named by the keywords of `generate` / `gen` / `sampling_params`
        (None when none is given); two at once are a `ConstraintError` naming both."""
        fields = {
            "regex": regex,
            "json_schema": json_schema,
            "choices": choices,
            "dtype": dtype,
            "grammar": grammar,
            "ebnf": ebnf,
            "structural_tag": structural_tag,
        }
        given = given_kinds(fields)
        if len(given) > 1:
            raise ConstraintError(f"give at most one constraint, got {given}", given[0])
        if not given:
            if json_schema_mode is not None and json_schema_mode not in JSON_SCHEMA_MODES:
                msg = f"json_schema_mode must be one of {list(JSON_SCHEMA_MODES)}, got "
                raise ConstraintError(msg + repr(json_schema_mode), "json_schema_mode")
            return None
        return cls.of(
            given[0],
            fields[given[0]],
            json_schema_mode=json_schema_mode,
            whitespace_pattern=whitespace_pattern,
            default_mode=default_mode,
        )

    @classmethod
    def from_kwargs(
        cls, kwargs: Mapping[str, Any], *, default_mode: str = DEFAULT_MODE
    ) -> Constraint | None:
        """`from_fields` over the constraint keywords of a keyword dict (others ignored)."""
        return cls.from_fields(
            **{k: kwargs[k] for k in FIELDS if k in kwargs}, default_mode=default_mode
        )

    # ---- to the compile worker and back ------------------------------------------------------
    def wire(self) -> tuple:
        """The constraint as strings and numbers (JSON text for `JSON_KINDS`)."""
        return self.key

    @classmethod
    def from_wire(cls, wire: tuple) -> Constraint:
        kind, text, *rest = wire
        value = json.loads(text) if kind in JSON_KINDS else text
        if kind == "choices":
            value = tuple(value)
        return cls(kind, value, *rest)


def _normalise(kind: str, value: Any) -> Any:
    if kind == "json_schema":
        return load_schema(value)  # a pydantic class or JSON text: the dict (GrammarError else)
    if kind == "structural_tag":
        if isinstance(value, str | bytes):
            try:
                value = json.loads(value)  # JSON text, as SGLang and vLLM send it
            except ValueError as exc:
                raise ConstraintError(f"structural_tag is not valid JSON: {exc}", kind) from None
        return value
    if kind == "choices":
        if isinstance(value, str) or not hasattr(value, "__iter__"):
            raise ConstraintError("choices must be a list of strings", kind)
        return tuple(value)
    if kind == "dtype":
        if isinstance(value, str):
            if value not in DTYPE_NAMES:
                msg = f"dtype must be one of {sorted(DTYPE_NAMES)}, got {value!r}"
                raise ConstraintError(msg, kind)
            return value
        names = {t: name for name, t in DTYPE_NAMES.items()}
        if value not in names:
            msg = f"dtype must be one of {sorted(DTYPE_NAMES)}, got {value!r}"
            raise ConstraintError(msg, kind)
        return names[value]
    return value  # regex, grammar (lark), ebnf: their text
