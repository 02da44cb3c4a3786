"""The expressions a program appends: `gen`, `select`, and the role blocks."""

from __future__ import annotations

import json
from typing import Any

from .errors import ProgramError
from .ir import Gen, RoleBlock, Select, as_expr

_DTYPES = {int: "int", float: "float", bool: "bool", str: "str"}


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    seed: int | None = None,
    return_logprob: bool | None = None,
    regex: str | None = None,
    json_schema: Any = None,
    choices: list[str] | None = None,
    dtype: type | str | None = None,
    grammar: str | None = None,
) -> Gen:
    """Generate text into variable `name`. Unset options take the run's defaults.

    At most one constraint (`regex`, `json_schema`, `choices`, `dtype`, `grammar`) may be
    given. `json_schema` is a dict, JSON text or a pydantic model class; `dtype` is int, float,
    bool or str; `grammar` is the text of a lark (LALR) grammar. The variable always holds the
    generated text as a `str`.
    """
    constraints = [c for c in (regex, json_schema, choices, dtype, grammar) if c is not None]
    if len(constraints) > 1:
        raise ProgramError(
            f"gen({name!r}): give at most one of regex, json_schema, choices, dtype, grammar"
        )
    params = {
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "stop": [stop] if isinstance(stop, str) else stop,
        "stop_token_ids": stop_token_ids,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "ignore_eos": ignore_eos,
        "seed": seed,
        "return_logprob": return_logprob,
        "regex": regex,
        "json_schema": None if json_schema is None else schema_text(json_schema),
        "choices": None if choices is None else [str(c) for c in choices],
        "dtype": None if dtype is None else dtype_name(dtype),
        "grammar": grammar,
    }
    return Gen(name, {k: v for k, v in params.items() if v is not None})


def select(name: str | None = None, choices: list[str] | None = None, method: Any = None) -> Select:
    """Choose one of `choices` by scoring each as a continuation of the text so far.

    `method` is "token_length_normalized" (default, mean token log-likelihood), "greedy"
    (token by token), "unconditional_likelihood_normalized", or a `SelectMethod`.
    """
    if not choices:
        raise ProgramError(f"select({name!r}) needs a non-empty list of choices")
    from .select_methods import resolve_method

    return Select(name, [str(c) for c in choices], resolve_method(method))


def system(content: Any = "") -> RoleBlock:
    return RoleBlock("system", as_expr(content))


def user(content: Any = "") -> RoleBlock:
    return RoleBlock("user", as_expr(content))


def assistant(content: Any = "") -> RoleBlock:
    return RoleBlock("assistant", as_expr(content))


def schema_text(schema: Any) -> str:
    """A JSON Schema as compact JSON text, from a dict, JSON text or a pydantic class."""
    if isinstance(schema, str):
        json.loads(schema)  # fail here, at the program's line, on malformed JSON
        return schema
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema(), separators=(",", ":"))
    if isinstance(schema, dict):
        return json.dumps(schema, separators=(",", ":"))
    raise ProgramError(
        f"json_schema must be a dict, JSON text or a pydantic model class, not {type(schema)}"
    )


def dtype_name(dtype: type | str) -> str:
    name = _DTYPES.get(dtype) if isinstance(dtype, type) else dtype
    if name not in _DTYPES.values():
        raise ProgramError(f"dtype must be int, float, bool or str, not {dtype!r}")
    return name
