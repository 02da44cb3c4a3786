"""`gen(name, type=T)`: the constraint is T's JSON Schema, `state[name]` is the parsed T, the raw
text stays in `state.text()`; a type that cannot be constrained is a `TypeError` when traced."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field, StringConstraints, TypeAdapter
from typing_extensions import TypedDict

import sgl_dsl as sgl
from tests.support.dsl_backends import FakeBackend


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Person(BaseModel):
    name: str
    age: Annotated[int, Field(ge=0, le=120)]


@dataclasses.dataclass
class Point:
    x: int
    y: float | None


class Movie(TypedDict):
    title: str
    good: bool


CASES = [
    pytest.param(int, "42", 42, id="int"),
    pytest.param(float, "2.5", 2.5, id="float"),
    pytest.param(bool, "true", True, id="bool"),
    pytest.param(str, '"Paris"', "Paris", id="str"),
    pytest.param(Literal["yes", "no"], '"no"', "no", id="literal"),
    pytest.param(Color, '"blue"', Color.BLUE, id="enum-member"),
    pytest.param(Person, '{"name":"Ada","age":36}', Person(name="Ada", age=36), id="pydantic"),
    pytest.param(Point, '{"x":1,"y":null}', Point(1, None), id="dataclass"),
    pytest.param(
        Movie, '{"title":"Up","good":true}', {"title": "Up", "good": True}, id="typeddict"
    ),
    pytest.param(list[int], "[1,2,3]", [1, 2, 3], id="list"),
    pytest.param(dict[str, int], '{"a":1}', {"a": 1}, id="dict"),
    pytest.param(int | None, "null", None, id="optional"),
    pytest.param(Annotated[int, Field(ge=0)], "7", 7, id="annotated-field"),
    pytest.param(
        Annotated[str, StringConstraints(pattern=r"^[a-z]{3}$")], '"abc"', "abc", id="pattern"
    ),
    pytest.param(Annotated[str, re.compile(r"^\d+$")], '"123"', "123", id="re-pattern"),
]


def typed_program(tp: Any) -> sgl.SglFunction:
    @sgl.function
    def program(s):
        s += "value:" + sgl.gen("v", type=tp, max_tokens=32)

    return program


@pytest.mark.parametrize("tp, answer, value", CASES)
def test_the_variable_is_the_parsed_value_and_the_text_is_raw(tp, answer, value):
    backend = FakeBackend(answers={"value:": answer})
    state = typed_program(tp).run(backend=backend)
    assert state["v"] == value
    assert type(state["v"]) is type(value)
    assert state.text() == "value:" + answer
    sent = json.loads(backend.calls[-1][2]["json_schema"])
    if not any(isinstance(m, re.Pattern) for m in getattr(tp, "__metadata__", ())):
        assert sent == TypeAdapter(tp).json_schema()  # (a bare re.Pattern: the test below)


@pytest.mark.parametrize("tp, answer, value", CASES[:8])
def test_run_async_parses_the_same_values(tp, answer, value):
    backend = FakeBackend(answers={"value:": answer})
    state = asyncio.run(typed_program(tp).run_async(backend=backend))
    assert state["v"] == value


def test_a_bare_re_pattern_annotation_is_kept_as_the_schemas_pattern():
    backend = FakeBackend(answers={"value:": '"12"'})
    typed_program(Annotated[str, re.compile(r"^\d+$")]).run(backend=backend)
    assert json.loads(backend.calls[-1][2]["json_schema"])["pattern"] == r"^\d+$"


class Opaque:
    """A class pydantic cannot describe."""


@pytest.mark.parametrize(
    "tp, named",
    [
        pytest.param(set[int], "uniqueItems", id="unsupported-keyword"),
        pytest.param(Opaque, "Opaque", id="unknown-class"),
        pytest.param(Callable[[int], int], "Callable", id="callable"),
    ],
)
def test_a_type_that_cannot_be_constrained_is_a_type_error_at_trace_time(tp, named):
    with pytest.raises(TypeError, match=re.escape(named)) as info:
        typed_program(tp).trace()
    assert "gen('v')" in str(info.value) and "cannot be constrained" in str(info.value)


def test_type_and_another_constraint_together_are_refused():
    with pytest.raises(sgl.ProgramError, match="at most one"):
        sgl.gen("v", type=int, regex="[0-9]+")


def test_an_output_that_does_not_validate_names_the_variable_and_type():
    backend = FakeBackend(answers={"value:": '{"name":"Ada","age":-1}'})
    with pytest.raises(sgl.ProgramError, match=r"gen\('v', type=Person\)"):
        typed_program(Person).run(backend=backend)


def test_n_samples_give_a_list_of_values():
    backend = FakeBackend(answers={"value:": '"red"'})

    @sgl.function
    def program(s):
        s += "value:" + sgl.gen("v", type=Color, n=3, max_tokens=8)

    assert program.run(backend=backend)["v"] == [Color.RED] * 3


def test_dtype_and_json_schema_keep_their_text_values():
    backend = FakeBackend(answers={"a:": "5", "b:": '{"name":"Ada","age":3}'})

    @sgl.function
    def program(s):
        s += "a:" + sgl.gen("a", dtype=int) + "\nb:" + sgl.gen("b", json_schema=Person)

    state = program.run(backend=backend)
    assert state["a"] == "5" and state["b"] == '{"name":"Ada","age":3}'


def test_the_trace_shows_the_type():
    assert "type=Person" in str(typed_program(Person).trace())


# ---- the real engine: constrained by the type, every value valid ---------------------------


class Review(BaseModel):
    stars: Annotated[int, Field(ge=1, le=5)]
    verdict: Literal["good", "bad"]
    recommended: bool


FINITE = [
    pytest.param(Review, id="pydantic"),
    pytest.param(Color, id="enum"),
    pytest.param(Literal["a", "b", "c"], id="literal"),
    pytest.param(Annotated[int, Field(ge=0, le=99)], id="bounded-int"),
    pytest.param(Annotated[str, StringConstraints(pattern=r"^[a-z]{4}$")], id="pattern"),
    pytest.param(Annotated[list[bool], Field(max_length=3)], id="list"),
]


@pytest.mark.parametrize("tp", FINITE)
def test_engine_outputs_parse_and_validate(runtime, tp):
    @sgl.function
    def program(s, i):
        s += "Item " + i + ":" + sgl.gen("v", type=tp, max_tokens=64, temperature=0.7, seed=1)

    batch = [{"i": str(i)} for i in range(3)]
    states = program.run_batch(batch, backend=runtime)
    states += asyncio.run(program.run_batch_async(batch, backend=runtime))
    schema = TypeAdapter(tp).json_schema()
    for state in states:
        assert state.error is None
        raw = state.text().split(":", 1)[1]
        jsonschema.validate(json.loads(raw), schema)
        assert TypeAdapter(tp).validate_json(raw) == state["v"]
