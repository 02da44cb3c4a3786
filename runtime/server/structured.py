"""The output constraint of a request: which field gave it, and the engine keywords it becomes.

OpenAI clients, vLLM (before and since 0.12), SGLang and this server's own API name the same
few kinds of constraint differently. Every request field that constrains the output is read
here and mapped to one engine keyword, or refused with a 400 that names it; two of them in one
request are a 400 that names both (no precedence rule silently drops one).

    kind            engine keyword   /v1 fields                                   /generate
    json_schema     json_schema      response_format json_schema, guided_json,     json_schema
                                     structured_outputs.json, json_schema
    json_object     regex            response_format json_object,                 -
                                     structured_outputs.json_object
    regex           regex            guided_regex, structured_outputs.regex,      regex
                                     regex
    choices         choices          guided_choice, structured_outputs.choice     choices
    ebnf (GBNF)     ebnf             guided_grammar, structured_outputs.grammar,  ebnf
                                     ebnf
    structural_tag  structural_tag   response_format structural_tag,              structural_tag
                                     structured_outputs.structural_tag
    lark            grammar          -                                            lark, grammar

`logit_bias` (token id -> bias in [-100, 100]) is checked here too; it steers rather than
constrains, and goes with any of them.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from runtime.server.errors import APIError
from runtime.server.protocol import SamplingFields

# JSON-object mode: any object, nested objects/arrays unrolled to this depth
JSON_OBJECT_DEPTH = 2
LOGIT_BIAS_LIMIT = 100.0
# vLLM's structured_outputs keys that constrain the output, and the kind each is
STRUCTURED_OUTPUTS_KINDS = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "choices",
    "grammar": "ebnf",
    "json_object": "json_object",
    "structural_tag": "structural_tag",
}
# ... and those that only tune one: the whitespace between JSON tokens (ours is compact unless
# a pattern is given, which satisfies `disable_any_whitespace`), strict objects (our default
# mode), the backend choice (this server is the backend)
STRUCTURED_OUTPUTS_OPTIONS = frozenset(
    (
        "whitespace_pattern",
        "disable_any_whitespace",
        "disable_additional_properties",
        "disable_fallback",
        "backend",
        "_backend",
        "_backend_was_auto",
    )
)
# what the grammar package must export for a kind (newer kinds may be missing from a build)
_COMPILERS = {"ebnf": "compile_ebnf", "structural_tag": "compile_structural_tag"}


@dataclass(slots=True)
class OutputConstraint:
    """A request's constraint as the server read it: the field the user named it with, and the
    engine keywords it maps to (from which the engine builds the one `grammar.Constraint`)."""

    param: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _Given:
    param: str  # as the user wrote it, e.g. "structured_outputs.json"
    kind: str
    value: Any


# ---- JSON schemas --------------------------------------------------------------------------
@functools.cache
def json_object_regex(whitespace: str | None = None) -> str:
    """A regex for any JSON object (nesting unrolled to `JSON_OBJECT_DEPTH`)."""
    from grammar import json_schema_to_regex

    return json_schema_to_regex(
        {"type": "object"}, whitespace=whitespace, any_depth=JSON_OBJECT_DEPTH
    )


def check_schema(schema: Any, param: str, mode: str = "strict", pool: Any = None) -> None:
    """Raise a 400 naming the keyword when the grammar cannot honour `schema` as generated
    under `mode` (the same construction `compile_json_schema` uses, automaton-only shapes
    included). The default, strict, refuses nothing that strict mode compiles. `pool`: the
    engine's compile pool, handed to the server (`ServerState.compile_pool`): the schema is
    compiled there, in a worker, within the budget, and kept for the engine; None: only
    checked here."""
    from grammar import Constraint, GrammarError
    from grammar.json_schema.schema import json_schema_to_node, load_schema
    from grammar.json_schema.strict import apply_mode
    from runtime.scheduling import compile_pool

    try:
        if pool is not None:
            pool.compile(Constraint.of("json_schema", schema, json_schema_mode=mode))
        else:
            json_schema_to_node(apply_mode(load_schema(schema), mode))
    except GrammarError as exc:
        code = "unsupported_schema_keyword" if hasattr(exc, "keyword") else "invalid_schema"
        if isinstance(exc, compile_pool.CompileBudgetError):
            code = "constraint_too_complex"
        raise APIError(400, str(exc), param=param, code=code) from exc
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        msg = f"invalid JSON schema: {exc}"
        raise APIError(400, msg, param=param, code="invalid_schema") from exc


def schema_constraint(schema: Any, mode: str, param: str, pool: Any = None) -> dict[str, Any]:
    """`{"json_schema", "json_schema_mode"}` after checking the schema as it is generated."""
    check_schema(schema, param, mode, pool)
    return {"json_schema": schema, "json_schema_mode": mode}


# ---- reading the fields --------------------------------------------------------------------
def _response_format(body: SamplingFields) -> list[_Given]:
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return []
    if fmt.type == "json_object":
        return [_Given("response_format", "json_object", True)]
    if fmt.type == "structural_tag":
        if fmt.format is not None:  # XGrammar's shape
            spec: dict[str, Any] = {"type": "structural_tag", "format": fmt.format}
        elif fmt.structures is not None:  # SGLang's older shape
            spec = {"structures": fmt.structures, "triggers": fmt.triggers or []}
        else:
            msg = "response_format structural_tag needs `format` or `structures` + `triggers`"
            raise APIError(400, msg, param="response_format")
        return [_Given("response_format", "structural_tag", spec)]
    if fmt.json_schema is None:
        raise APIError(
            400,
            "response_format json_schema needs a json_schema object",
            param="response_format.json_schema",
        )
    return [_Given("response_format.json_schema.schema", "json_schema", fmt.json_schema.schema_)]


def _structured_outputs(raw: dict[str, Any]) -> list[_Given]:
    unknown = sorted(set(raw) - set(STRUCTURED_OUTPUTS_KINDS) - STRUCTURED_OUTPUTS_OPTIONS)
    if unknown:
        known = sorted({*STRUCTURED_OUTPUTS_KINDS, *STRUCTURED_OUTPUTS_OPTIONS} - {"_backend"})
        raise APIError(
            400,
            f"structured_outputs.{unknown[0]} is not supported here; known keys: {known}",
            param=f"structured_outputs.{unknown[0]}",
        )
    given = []
    for key, kind in STRUCTURED_OUTPUTS_KINDS.items():
        value = raw.get(key)
        if value is None or (key == "json_object" and value is False):
            continue
        given.append(_Given(f"structured_outputs.{key}", kind, value))
    return given


def _openai_given(body: SamplingFields) -> list[_Given]:
    given = _response_format(body)
    plain = (
        ("guided_json", "json_schema"),
        ("guided_regex", "regex"),
        ("guided_choice", "choices"),
        ("guided_grammar", "ebnf"),
        ("json_schema", "json_schema"),
        ("regex", "regex"),
        ("ebnf", "ebnf"),
    )
    given += [_Given(f, k, getattr(body, f)) for f, k in plain if getattr(body, f) is not None]
    if body.structured_outputs is not None:
        given += _structured_outputs(body.structured_outputs)
    return given


def _only_one(given: list[_Given]) -> _Given | None:
    if len(given) > 1:
        names = " and ".join(g.param for g in given)
        raise APIError(
            400,
            f"give at most one constraint on the output; this request has {names}",
            param=given[1].param,
            code="conflicting_constraints",
        )
    return given[0] if given else None


def _whitespace(body: SamplingFields) -> str | None:
    raw = body.structured_outputs or {}
    pairs = [
        ("guided_whitespace_pattern", body.guided_whitespace_pattern),
        ("structured_outputs.whitespace_pattern", raw.get("whitespace_pattern")),
    ]
    given = [(name, v) for name, v in pairs if v is not None]
    if len(given) == 2 and given[0][1] != given[1][1]:
        raise APIError(
            400, "guided_whitespace_pattern and structured_outputs.whitespace_pattern differ",
            param="guided_whitespace_pattern",
        )  # fmt: skip
    if not given:
        return None
    name, pattern = given[0]
    if not isinstance(pattern, str):
        raise APIError(400, f"{name} must be a regex string", param=name)
    return pattern


# ---- to engine keywords --------------------------------------------------------------------
def require_compiler(kind: str, param: str) -> None:
    """A 400 naming the field when this build's grammar package cannot compile `kind`."""
    import grammar

    name = _COMPILERS.get(kind)
    if name is not None and not hasattr(grammar, name):
        raise APIError(
            400,
            f"{param}: {kind} constraints are not supported by this server's grammar package",
            param=param,
            code="unsupported_constraint",
        )


def structural_tag_spec(value: Any, param: str) -> dict[str, Any]:
    """A structural tag as a dict (vLLM and SGLang send it as JSON text)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise APIError(400, f"{param} is not valid JSON: {exc}", param=param) from exc
    if not isinstance(value, dict):
        raise APIError(400, f"{param} must be a JSON object", param=param)
    return value


def _engine_kwargs(
    given: _Given, mode: str, whitespace: str | None, pool: Any = None
) -> dict[str, Any]:
    kind, value, param = given.kind, given.value, given.param
    require_compiler(kind, param)
    if kind == "json_schema":
        out = schema_constraint(value, mode, param, pool)
        if whitespace is not None:
            out["whitespace_pattern"] = whitespace
        return out
    if kind == "json_object":
        return {"regex": json_object_regex(whitespace)}
    if kind == "choices":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            msg = f"{param} must be a non-empty list of strings"
            raise APIError(400, msg, param=param, code="invalid_constraint")
        return {"choices": list(value)}
    if kind == "structural_tag":
        out = {"structural_tag": structural_tag_spec(value, param)}
        if whitespace is not None:  # between the JSON tokens of its schema contents
            out["whitespace_pattern"] = whitespace
        return out
    if not isinstance(value, str):
        raise APIError(400, f"{param} must be a string", param=param, code="invalid_constraint")
    return {kind: value}  # regex, ebnf


def openai_constraint(body: SamplingFields, mode: str, pool: Any = None) -> OutputConstraint:
    """The output constraint of a /v1 request (none: an empty `OutputConstraint`).

    `mode` is the JSON-schema mode ("strict" or "exact"); vLLM's
    `disable_additional_properties` asks for strict objects whatever the mode. `pool`: the
    server's compile pool (`check_schema`)."""
    given = _only_one(_openai_given(body))
    whitespace = _whitespace(body)
    if given is None:
        return OutputConstraint()
    if (body.structured_outputs or {}).get("disable_additional_properties"):
        mode = "strict"
    return OutputConstraint(given.param, _engine_kwargs(given, mode, whitespace, pool))


def logit_bias(raw: Any, vocab_size: int, param: str = "logit_bias") -> dict[int, float] | None:
    """OpenAI's `logit_bias` (token ids as strings or ints -> bias in [-100, 100]) checked
    against the model's vocabulary; a bad id or value is a 400 naming it."""
    if raw is None or raw == {}:
        return None
    if not isinstance(raw, dict):
        raise APIError(400, f"{param} must map token ids to biases", param=param)
    out: dict[int, float] = {}
    for key, value in raw.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            token = -1
        if not 0 <= token < vocab_size:
            msg = f"{param}: {key!r} is not a token id of this model (0 to {vocab_size - 1})"
            raise APIError(400, msg, param=param)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:
            msg = f"{param}[{key!r}]: the bias must be a number in [-100, 100], got {value!r}"
            raise APIError(400, msg, param=param)
        out[token] = float(value)
    return out


# /generate's sampling_params key -> kind (SGLang's names; `lark` and `grammar` are ours)
NATIVE_KINDS = {
    "json_schema": "json_schema",
    "regex": "regex",
    "ebnf": "ebnf",
    "structural_tag": "structural_tag",
    "lark": "lark",
    "grammar": "lark",
    "choices": "choices",
    "dtype": "dtype",
}


def native_constraint(params: dict[str, Any], pool: Any = None) -> OutputConstraint:
    """The output constraint in one /generate `sampling_params` dict (its constraint keys are
    removed from `params`; the engine keywords come back); `pool` as for `check_schema`."""
    given = _only_one(
        [
            _Given(key, kind, params.pop(key))
            for key, kind in NATIVE_KINDS.items()
            if params.get(key) is not None
        ]
    )
    if given is None:
        return OutputConstraint()
    if given.kind == "lark":
        if not isinstance(given.value, str):
            raise APIError(400, f"{given.param} must be lark grammar text", param=given.param)
        return OutputConstraint(given.param, {"grammar": given.value})
    if given.kind == "dtype":
        return OutputConstraint(given.param, {"dtype": given.value})
    mode = params.get("json_schema_mode", "strict")
    return OutputConstraint(given.param, _engine_kwargs(given, mode, None, pool))


def constraint_field(body: SamplingFields) -> str | None:
    """The field that constrains a /v1 request's output (None: none does); two are a 400."""
    given = _only_one(_openai_given(body))
    return None if given is None else given.param
