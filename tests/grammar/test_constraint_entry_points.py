"""One `grammar.Constraint` whichever way a request enters: the engine's keywords, the server's
/generate and /v1 fields, a DSL program's gen(), the compile worker's message; and the compile
pool reaches the server's checks because it is handed over, not looked up."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import sgl_dsl as sgl
from grammar import Constraint, ConstraintError
from runtime.scheduling.constrained import ConstraintHooks
from runtime.server.chat import CompletionsRequest
from runtime.server.structured import check_schema, native_constraint, openai_constraint

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture
def hooks():
    h = ConstraintHooks(None, (), json_schema_mode="strict")
    yield h
    h.shutdown()


def _engine(hooks: ConstraintHooks, kwargs: dict) -> Constraint | None:
    """What `Engine.generate(**kwargs)` builds (its keywords, its default mode)."""
    return hooks.constraint_of(kwargs)


def _dsl_through_server(hooks: ConstraintHooks, **gen_kwargs) -> Constraint | None:
    """gen() -> RuntimeEndpoint's sampling_params -> the server's /generate -> the engine."""
    from sgl_dsl.backend.endpoint import RuntimeEndpoint

    endpoint = RuntimeEndpoint.__new__(RuntimeEndpoint)  # no server to reach: only `_body`
    endpoint.server = "runtime"
    params = sgl.gen("x", **gen_kwargs).params
    sampling = endpoint._body("hi", params, False)["sampling_params"]
    return _engine(hooks, native_constraint(dict(sampling)).kwargs)


@pytest.mark.parametrize("mode", ["strict", "exact"])
def test_a_json_schema_is_one_value_from_every_entry_point(hooks, mode):
    direct = Constraint.of("json_schema", SCHEMA, json_schema_mode=mode)
    engine = _engine(hooks, {"json_schema": SCHEMA, "json_schema_mode": mode, "top_k": 3})
    native = _engine(hooks, native_constraint({"json_schema": json.dumps(SCHEMA),
                                               "json_schema_mode": mode}).kwargs)  # fmt: skip
    body = CompletionsRequest(
        prompt="hi",
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}},
    )
    v1 = _engine(hooks, openai_constraint(body, mode).kwargs)
    dsl = _dsl_through_server(hooks, json_schema=SCHEMA, json_schema_mode=mode)
    worker = Constraint.from_wire(direct.wire())
    assert engine == native == v1 == dsl == worker == direct


def test_the_engine_default_mode_is_the_constraint_default(hooks):
    assert _engine(hooks, {"json_schema": SCHEMA}) == Constraint.of(
        "json_schema", SCHEMA, json_schema_mode="strict"
    )
    exact = ConstraintHooks(None, (), json_schema_mode="exact")
    try:
        assert exact.constraint_of({"json_schema": SCHEMA}).json_schema_mode == "exact"
    finally:
        exact.shutdown()


@pytest.mark.parametrize(
    "gen_kwargs, engine_kwargs",
    [
        ({"regex": "[0-9]+"}, {"regex": "[0-9]+"}),
        ({"ebnf": 'root ::= "a"'}, {"ebnf": 'root ::= "a"'}),
        ({"grammar": 'start: "a"'}, {"grammar": 'start: "a"'}),
        ({"dtype": int}, {"dtype": "int"}),
    ],
)
def test_other_kinds_agree_between_the_dsl_and_the_engine(hooks, gen_kwargs, engine_kwargs):
    dsl = _dsl_through_server(hooks, **gen_kwargs)
    engine = _engine(hooks, engine_kwargs)
    if "dtype" in gen_kwargs:  # gen(dtype=) travels as the regex it means
        assert dsl.kind == "regex" and engine.kind == "dtype"
    else:
        assert dsl == engine


def test_the_engine_refuses_two_constraints_naming_both(hooks):
    req = SimpleNamespace(prompt_ids=[1], constraint=None, cache_limit=None)
    with pytest.raises(ConstraintError) as err:
        hooks.attach(req, regex="a", choices=["b"])
    assert err.value.field == "regex" and "choices" in str(err.value)
    assert req.constraint is None  # nothing was submitted


class _RecordingPool:
    """Stands in for the engine's compile pool: records what the server asks it to compile."""

    def __init__(self) -> None:
        self.compiled: list[Constraint] = []

    def compile(self, constraint: Constraint) -> None:
        self.compiled.append(constraint)


def test_the_server_checks_schemas_in_the_pool_it_was_handed():
    from runtime.server.app import build_state

    pool = _RecordingPool()
    engine = SimpleNamespace(
        model_path=SimpleNamespace(name="m"),
        config=SimpleNamespace(max_position_embeddings=64),
        pool=SimpleNamespace(capacity_tokens=64),
        compile_pool=pool,
    )
    state = build_state(engine)
    assert state.compile_pool is pool  # the engine's, handed over
    other = _RecordingPool()
    assert build_state(engine, compile_pool=other).compile_pool is other
    check_schema(SCHEMA, "response_format", "exact", state.compile_pool)
    assert pool.compiled == [Constraint.of("json_schema", SCHEMA, json_schema_mode="exact")]
    assert other.compiled == []
