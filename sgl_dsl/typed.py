"""Typed results: `gen(name, type=T)` constrains the output to T's JSON form and parses it.

The constraint is T's JSON Schema as pydantic's `TypeAdapter` writes it, so every type pydantic
can describe works: `int`, `float`, `bool`, `str`, `Literal[...]`, `Enum`, pydantic models,
dataclasses, `TypedDict`, `list[T]`, `dict[str, T]`, `T | None`, and annotated constraints
(`Annotated[int, Field(ge=0)]`, `Annotated[str, StringConstraints(pattern=...)]`, or a compiled
`re.Pattern` as the annotation). The text generated is T's compact JSON (a `str` is a quoted JSON
string); the variable holds `TypeAdapter(T).validate_json(text)`: a model instance, an Enum member.

Every schema is checked against the grammar's JSON Schema front end when the `gen` is built, so
a type whose schema has a keyword the grammar cannot honour (or that pydantic cannot describe)
is a `TypeError` naming the type at trace time, never a constraint dropped on the way.
"""

from __future__ import annotations

import json
import re
import threading
import typing
from dataclasses import dataclass
from typing import Annotated, Any

from .errors import ProgramError


@dataclass(frozen=True, slots=True)
class ResultType:
    """What `gen(type=T)` constrains to (`schema`, compact JSON text) and parses into."""

    type: Any
    schema: str
    adapter: Any  # pydantic.TypeAdapter of `type` (with re.Pattern annotations made explicit)

    @property
    def name(self) -> str:
        return type_name(self.type)

    def parse(self, text: str, var: str | None, finish_reason: Any = None) -> Any:
        """T's value of the generated JSON `text`; a `ProgramError` naming the variable, the
        type and why the model stopped (e.g. cut at max_tokens) when it does not validate."""
        try:
            return self.adapter.validate_json(text)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            cut = " (cut at max_tokens: raise max_tokens)" if finish_reason == "length" else ""
            raise ProgramError(
                f"gen({var!r}, type={self.name}): the output {_short(text)} is not a valid "
                f"{self.name}{cut}: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"ResultType({self.name})"


_cache: dict[Any, ResultType] = {}
_lock = threading.Lock()


def result_type(tp: Any, where: str) -> ResultType:
    """The `ResultType` of `tp` (cached per type); `TypeError` naming `tp` if it cannot be
    constrained. `where` names the call in the message (e.g. "gen('age')")."""
    key = _cache_key(tp)
    with _lock:
        cached = _cache.get(key)
    if cached is not None:
        return cached
    adapter, schema = _schema_of(tp, where)
    _check_constrainable(tp, schema, where)
    built = ResultType(tp, json.dumps(schema, separators=(",", ":")), adapter)
    with _lock:
        _cache[key] = built
    return built


def type_name(tp: Any) -> str:
    """`Person`, `list[int]`, `Literal['a', 'b']`: how a type reads in messages and the IR."""
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__qualname__
    return repr(tp).replace("typing.", "")


def _cache_key(tp: Any) -> Any:
    try:
        hash(tp)
    except TypeError:  # an annotation's metadata may be unhashable; its repr names it fully
        return ("repr", repr(tp))
    return tp


def _schema_of(tp: Any, where: str) -> tuple[Any, dict[str, Any]]:
    from pydantic import TypeAdapter
    from pydantic.errors import PydanticUserError

    try:
        adapter = TypeAdapter(_explicit_patterns(tp))
        schema = adapter.json_schema()
    except (PydanticUserError, TypeError, ValueError, NameError) as exc:
        raise TypeError(
            f"{where}: type={type_name(tp)} cannot be constrained: pydantic cannot describe it "
            f"as a JSON Schema ({str(exc).splitlines()[0]})"
        ) from exc
    return adapter, schema


def _check_constrainable(tp: Any, schema: dict[str, Any], where: str) -> None:
    """The grammar builds a regex from the schema, or names the keyword it cannot honour."""
    from grammar import GrammarError, json_schema_to_regex

    try:
        json_schema_to_regex(schema)
    except GrammarError as exc:
        raise TypeError(f"{where}: type={type_name(tp)} cannot be constrained: {exc}") from exc


def _explicit_patterns(tp: Any) -> Any:
    """`Annotated[str, re.compile(p)]` as `Annotated[str, StringConstraints(pattern=p)]`:
    pydantic itself ignores a bare `re.Pattern` annotation, which would drop the constraint."""
    if typing.get_origin(tp) is not Annotated:
        return tp
    base, *metadata = typing.get_args(tp)
    if not any(isinstance(m, re.Pattern) for m in metadata):
        return tp
    from pydantic import StringConstraints

    explicit = [
        StringConstraints(pattern=m.pattern) if isinstance(m, re.Pattern) else m for m in metadata
    ]
    return Annotated[(base, *explicit)]  # type: ignore[valid-type]


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")
