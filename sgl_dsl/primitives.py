"""The expressions a program appends: `gen`, `select`, and the role blocks."""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from .errors import ProgramError
from .ir import Gen, RoleBegin, RoleBlock, RoleEnd, Select, ToolLoop, as_expr

_DTYPES = {int: "int", float: "float", bool: "bool", str: "str"}


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    n: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    stop_regex: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    ignore_eos: bool | None = None,
    return_logprob: bool | None = None,
    logprob_start_len: int | None = None,
    top_logprobs_num: int | None = None,
    return_text_in_logprobs: bool | None = None,
    dtype: type | str | None = None,
    choices: list[str] | None = None,
    choices_method: Any = None,
    regex: str | None = None,
    json_schema: Any = None,
    seed: int | None = None,
    grammar: str | None = None,
    json_schema_mode: str | None = None,  # "strict" (the backend's default) or "exact"
    ebnf: str | None = None,
    structural_tag: Any = None,
    type: Any = None,  # the public keyword gen(name, type=T); shadows the builtin here only
    tools: Any = None,
    tool_choice: Any = None,
    token_healing: bool | None = None,
) -> Gen | Select:
    """Generate text into variable `name`. Unset options take the run's defaults.

    The positional order is SGLang's (`gen(name, max_tokens, min_tokens, n, stop, ...)`);
    `seed`, `grammar` and `json_schema_mode` are ours, after SGLang's keywords.
    At most one constraint (`regex`, `json_schema`, `choices`, `dtype`, `grammar`, `ebnf`,
    `structural_tag`, `type`) may be given. `json_schema` is a dict, JSON text or a pydantic model
    class; `dtype` is int, float, bool or str; `grammar` is the text of a lark (LALR) grammar;
    `ebnf` a GBNF grammar (llama.cpp's and XGrammar's dialect, as SGLang's `ebnf`);
    `structural_tag` a dict or its JSON text, in XGrammar's shape (`{"type": "structural_tag",
    "format": ...}`) or SGLang's (`{"structures": [...], "triggers": [...]}`). The variable
    holds the generated text as a `str`; with `tools=[functions or pydantic models]` (ours,
    `tool_choice` "auto" | "required" | "none" | one of the tools) the model writes calls in its
    own format, strictly, and the variable holds the `ToolCall`s or the text answer (see
    `sgl_dsl.tools`); with `type=T` (ours) the output is constrained to T's
    JSON form and the variable holds the parsed value (an int, an Enum member, a pydantic model
    instance: see `sgl_dsl.typed`), the raw text staying in `state.text()` (with `n` > 1: the
    list of the n texts or values, and the first is appended, as SGLang does). `stop_regex`
    ends the generation where a Python regex matches the text (cut before the match).
    `token_healing` (ours; default: on for a gen after text the program wrote, off right
    after a role marker) lets the first generated tokens merge with the end of the text before
    the gen, as the tokenizer would have written them unsplit (docs/programs.md).
    `choices` as in SGLang: with temperature unset or 0 (or a `choices_method`) it is
    `select(name, choices, 0, choices_method)`, scoring every choice; with temperature > 0
    (which SGLang refuses) the output is sampled constrained to the choices.
    """
    given = (regex, json_schema, choices, dtype, grammar, ebnf, structural_tag, type)
    if sum(c is not None for c in given) > 1:
        raise ProgramError(
            f"gen({name!r}): give at most one of regex, json_schema, choices, dtype, grammar, "
            "ebnf, structural_tag, type"
        )
    result = None
    if tools is not None or tool_choice is not None:
        return _tool_gen(name, tools, tool_choice, locals())
    if type is not None:
        from .typed import result_type

        result = result_type(type, f"gen({name!r})")  # TypeError here, at the program's line
        json_schema = result.schema
    if choices is not None and (choices_method is not None or not temperature):
        return select(name, choices, 0.0 if temperature is None else temperature, choices_method)
    if choices_method is not None:
        raise ProgramError(f"gen({name!r}): choices_method needs choices")
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ProgramError(f"gen({name!r}): n must be an integer >= 1, not {n!r}")
    params = {
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "n": None if n == 1 else n,
        "stop": [stop] if isinstance(stop, str) else (list(stop) if stop else None),
        "stop_token_ids": list(stop_token_ids) if stop_token_ids else None,
        "stop_regex": _regex_list(name, stop_regex),
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
        "ignore_eos": ignore_eos,
        "seed": seed,
        "return_logprob": return_logprob,
        "logprob_start_len": logprob_start_len,
        "top_logprobs_num": top_logprobs_num,
        "return_text_in_logprobs": return_text_in_logprobs,
        "regex": _checked_regex(name, regex),
        "json_schema": None if json_schema is None else schema_text(json_schema),
        "choices": None if choices is None else [str(c) for c in choices],
        "dtype": None if dtype is None else dtype_name(dtype),
        "grammar": grammar,
        "ebnf": ebnf,
        "structural_tag": None if structural_tag is None else _tag_text(name, structural_tag),
        "json_schema_mode": json_schema_mode,
        "token_healing": _checked_healing(name, token_healing),
    }
    return Gen(name, {k: v for k, v in params.items() if v is not None}, result)


def _checked_healing(name: Any, token_healing: Any) -> bool | None:
    if token_healing is not None and not isinstance(token_healing, bool):
        raise ProgramError(f"gen({name!r}): token_healing must be True or False")
    return token_healing


def _tool_gen(name: Any, tools: Any, tool_choice: Any, given: dict[str, Any]) -> Gen:
    """`gen(name, tools=..., tool_choice=...)`: the other keywords as for a plain gen."""
    from .tools import check_tool_gen, tool_params

    if tools is None:
        raise ProgramError(f"gen({name!r}): tool_choice needs tools")
    if given.get("type") is not None:
        raise ProgramError(f"gen({name!r}): tools cannot be combined with type")
    own = ("name", "tools", "tool_choice", "type")
    keep = {k: given[k] for k in inspect.signature(gen).parameters if k not in own}
    if given.get("choices") is not None:
        raise ProgramError(f"gen({name!r}): tools cannot be combined with choices")
    plain = gen(name, **keep)
    assert isinstance(plain, Gen)
    check_tool_gen(name, tools, plain.params)
    extra, toolset = tool_params(name, tools, tool_choice)
    return Gen(name, {**plain.params, **extra}, toolset)


def gen_int(name: str | None = None, max_tokens: int | None = None, *args: Any, **kw: Any) -> Gen:
    """SGLang's `gen_int`: `gen(..., dtype=int)` (same keywords as `gen`, no constraint)."""
    return _typed_gen(int, name, max_tokens, args, kw)


def gen_string(
    name: str | None = None, max_tokens: int | None = None, *args: Any, **kw: Any
) -> Gen:
    """SGLang's `gen_string`: `gen(..., dtype=str)`, a JSON string."""
    return _typed_gen(str, name, max_tokens, args, kw)


# SGLang's sampling keywords after max_tokens, in its order (gen_int / gen_string take them
# positionally; run() takes them, with max_new_tokens, as keywords)
SAMPLING_KEYWORDS = (
    "n",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "return_text_in_logprobs",
)


def _typed_gen(dtype: type, name: Any, max_tokens: Any, args: tuple, kw: dict) -> Gen:
    if len(args) > len(SAMPLING_KEYWORDS):
        raise ProgramError(f"gen_{dtype.__name__}() takes at most 17 positional arguments")
    kw = {**dict(zip(SAMPLING_KEYWORDS, args, strict=False)), **kw}
    bad = sorted(set(kw) - set(SAMPLING_KEYWORDS) - {"seed"})
    if bad:
        raise ProgramError(f"gen_{dtype.__name__}() got unexpected keyword(s) {bad}")
    out = gen(name, max_tokens, dtype=dtype, **kw)
    assert isinstance(out, Gen)
    return out


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: Any = None,
    *,
    method: Any = None,
) -> Select:
    """Choose one of `choices` by scoring each as a continuation of the text so far.

    SGLang's signature. `choices_method` (or `method`, our older name) is
    "token_length_normalized" (default, mean token log-likelihood), "greedy" (token by
    token), "unconditional_likelihood_normalized", `sgl.token_length_normalized` /
    `sgl.greedy_token_selection` / `sgl.unconditional_likelihood_normalized`, or a
    `SelectMethod`. Scoring has no temperature: above 0 is refused (SGLang asserts it).
    """
    if not choices:
        raise ProgramError(f"select({name!r}) needs a non-empty list of choices")
    if temperature is not None and temperature > 1e-5:
        raise ProgramError(
            f"select({name!r}): temperature {temperature} > 0 is not supported (choices are "
            "scored, as in SGLang); sample with gen(choices=..., temperature=...) instead"
        )
    if choices_method is not None and method is not None:
        raise ProgramError(f"select({name!r}): give choices_method or method, not both")
    from .select_methods import resolve_method

    return Select(name, [str(c) for c in choices], resolve_method(choices_method or method))


def image(expr: Any) -> Any:
    """SGLang's `image`: refused, the backends here serve text-only models."""
    raise ProgramError("sgl.image(): images are not supported (text-only models)")


def video(path: Any, num_frames: Any = None) -> Any:
    """SGLang's `video`: refused, the backends here serve text-only models."""
    raise ProgramError("sgl.video(): videos are not supported (text-only models)")


def _regex_list(name: Any, value: str | list[str] | None) -> list[str] | None:
    if not value:
        return None
    patterns = [value] if isinstance(value, str) else list(value)
    for p in patterns:
        _checked_regex(name, p)
    return patterns


def _checked_regex(name: Any, regex: str | None) -> str | None:
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            raise ProgramError(f"gen({name!r}): invalid regex {regex!r}: {exc}") from exc
    return regex


def system(content: Any = None) -> RoleBlock:
    return RoleBlock("system", as_expr("" if content is None else content))


def user(content: Any = None) -> RoleBlock:
    return RoleBlock("user", as_expr("" if content is None else content))


def assistant(content: Any = None) -> RoleBlock:
    return RoleBlock("assistant", as_expr("" if content is None else content))


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")


def _tag_text(name: Any, spec: Any) -> str:
    """A structural tag as compact JSON text (it crosses HTTP as SGLang sends it)."""
    try:
        loaded = json.loads(spec) if isinstance(spec, str) else spec
    except ValueError as exc:
        raise ProgramError(f"gen({name!r}): structural_tag is not valid JSON: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ProgramError(f"gen({name!r}): structural_tag must be a dict or its JSON text")
    return json.dumps(loaded, separators=(",", ":"))


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


def tool_loop(
    tools: Any,
    max_turns: int = 8,
    *,
    name: str = "answer",
    calls: str = "tool_calls",
    tool_choice: Any = "auto",
    on_max_turns: str = "error",
    **gen_kwargs: Any,
) -> ToolLoop:
    """`s += sgl.tool_loop(tools, max_turns=...)`: generate with tools, call the Python
    functions with the validated arguments, feed each result back as a `tool` message, until
    the model answers in text (or calls a pydantic-model tool: its instance is the answer).

    `state[name]` is the final answer, `state[calls]` every `ToolCall` made (with its
    `result`); `state.messages()` holds the turns. `tool_choice` applies to the first turn
    (later turns are "auto"). After `max_turns` generations without an answer:
    `on_max_turns="error"` raises `ProgramError` naming max_turns; "answer" makes the last turn
    a text answer (tool_choice "none"). `gen_kwargs` (max_tokens, temperature, ...) go to
    every turn's gen."""
    where = "tool_loop()"
    if not isinstance(max_turns, int) or max_turns < 1:
        raise ProgramError(f"{where}: max_turns must be an integer >= 1, not {max_turns!r}")
    if on_max_turns not in ("error", "answer"):
        raise ProgramError(f"{where}: on_max_turns must be 'error' or 'answer'")
    first = gen(name, tools=tools, tool_choice=tool_choice, **gen_kwargs)
    later = gen(name, tools=tools, tool_choice="auto", **gen_kwargs)
    last = gen(name, tools=tools, tool_choice="none", **gen_kwargs)
    return ToolLoop(name, calls, max_turns, on_max_turns, (first, later, last))
