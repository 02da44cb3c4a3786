"""Tools inside programs: `gen(name, tools=[...], tool_choice=...)` and `sgl.tool_loop(...)`.

A tool is a Python function or a pydantic model class. Its JSON Schema comes from the
function's signature and annotations (pydantic builds it; `Annotated[int, Field(ge=0,
description=...)]` works) or the model's own schema, its description from the docstring. Every
schema is checked against the grammar's JSON Schema front end when the `gen` is built, so a tool
the grammar cannot constrain is a `TypeError` naming the tool at trace time.

The calls are written in the MODEL's own tool-call format, strictly, by the server's tool
machinery (`runtime.server.tools`): the backend renders the conversation with the tools through
the chat template, constrains the answer by the format's structural tag / call schema for the
`tool_choice`, and reads the calls back with the format's parser (`Backend.chat`). The in-process
`Runtime` runs those functions itself; `RuntimeEndpoint` sends `/v1/chat/completions` with
`tools` (the server does the same); `OpenAI` sends the native `tools` field.

The variable of a tool gen is the list of `ToolCall`s (name + arguments validated by the tool's
pydantic model) when the model called tools, else the text it answered. `tool_loop` runs the
calls: each function is called with its validated arguments and its result goes back as a
`tool` message, until the model answers in text (or calls a pydantic-model tool, whose
validated instance is then the answer) or `max_turns` turns are spent.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ProgramError
from .ir import ToolLoop

TOOL_CHOICES = ("auto", "required", "none")
_NOT_RUN = object()


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: its OpenAI function entry and how its arguments are validated (and run)."""

    name: str
    description: str
    parameters: dict[str, Any]
    model: Any  # the pydantic model validating the arguments
    fn: Callable[..., Any] | None  # None for a pydantic-model tool (nothing to run)

    def openai(self) -> dict[str, Any]:
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}

    def validate(self, arguments: dict[str, Any]) -> Any:
        """The pydantic instance of `arguments` (a `ValueError` when they do not validate)."""
        return self.model.model_validate(arguments)


@dataclass(slots=True)
class ToolCall:
    """A call the model made: `name`, `arguments` (the validated values, by parameter name),
    `instance` (the validated pydantic instance: for a model tool, the model itself), the
    call's `id`, and once `tool_loop` ran it, its `result` (or the `error` it raised)."""

    id: str
    name: str
    arguments: dict[str, Any]
    instance: Any = None
    raw_arguments: str = "{}"
    result: Any = field(default=_NOT_RUN, repr=False)

    @property
    def ran(self) -> bool:
        return self.result is not _NOT_RUN

    def message(self) -> dict[str, Any]:
        """The call as an assistant message's `tool_calls` entry."""
        fn = {"name": self.name, "arguments": self.raw_arguments}
        return {"id": self.id, "type": "function", "function": fn}


# ---- building tools --------------------------------------------------------------------------


def tool_spec(tool: Any, where: str) -> ToolSpec:
    """The `ToolSpec` of a function or a pydantic model class; `TypeError` naming it when it
    cannot be described or constrained."""
    if isinstance(tool, ToolSpec):
        return tool
    if isinstance(tool, type) and hasattr(tool, "model_json_schema"):
        spec = _model_tool(tool, where)
    elif callable(tool) and not isinstance(tool, type):
        spec = _function_tool(tool, where)
    else:
        raise TypeError(f"{where}: tool {tool!r} is neither a function nor a pydantic model class")
    _check_constrainable(spec, where)
    return spec


def tool_specs(tools: Any, where: str) -> list[ToolSpec]:
    if callable(tools) or isinstance(tools, ToolSpec):
        tools = [tools]
    if not isinstance(tools, Sequence) or isinstance(tools, str) or not tools:
        raise ProgramError(f"{where}: tools must be a non-empty list of functions or models")
    specs = [tool_spec(t, where) for t in tools]
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ProgramError(f"{where}: two tools are named {dup}")
    return specs


def _model_tool(model: type, where: str) -> ToolSpec:
    try:
        schema = model.model_json_schema()
    except Exception as exc:  # pydantic's schema errors
        raise TypeError(f"{where}: tool {model.__name__} has no JSON Schema: {exc}") from exc
    schema.pop("title", None)
    description = schema.pop("description", None) or inspect.getdoc(model) or ""
    return ToolSpec(model.__name__, description, schema, model, None)


def _function_tool(fn: Callable[..., Any], where: str) -> ToolSpec:
    from pydantic import ConfigDict, create_model

    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        signature = inspect.signature(fn)
        hints = _type_hints(fn)
    except (TypeError, ValueError, NameError) as exc:
        raise TypeError(f"{where}: tool {name}: cannot read its signature: {exc}") from exc
    fields: dict[str, Any] = {}
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(
                f"{where}: tool {name}: parameter {p.name!r} ({p.kind.description}) cannot be "
                "passed by name from a call's JSON arguments"
            )
        if p.name not in hints:
            raise TypeError(
                f"{where}: tool {name}: parameter {p.name!r} has no type annotation (its JSON "
                "Schema comes from the annotation)"
            )
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (hints[p.name], default)
    try:
        model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        schema = model.model_json_schema()
    except Exception as exc:  # pydantic cannot describe an annotation
        raise TypeError(
            f"{where}: tool {name} cannot be constrained: pydantic cannot describe its "
            f"parameters as a JSON Schema ({str(exc).splitlines()[0]})"
        ) from exc
    schema.pop("title", None)
    for prop in (schema.get("properties") or {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return ToolSpec(name, inspect.getdoc(fn) or "", schema, model, fn)


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    import typing

    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__
    return typing.get_type_hints(target, include_extras=True)


def _check_constrainable(spec: ToolSpec, where: str) -> None:
    """The grammar builds the arguments' regex (strict mode), or names what it cannot honour."""
    from grammar import GrammarError, json_schema_to_regex
    from grammar.json_schema.schema import load_schema
    from grammar.json_schema.strict import apply_mode

    try:
        json_schema_to_regex(apply_mode(load_schema(spec.parameters), "strict"))
    except (GrammarError, ValueError, TypeError) as exc:
        raise TypeError(f"{where}: tool {spec.name} cannot be constrained: {exc}") from exc


def tool_choice_value(choice: Any, specs: list[ToolSpec], where: str) -> Any:
    """`tool_choice` in OpenAI's form: "auto" | "required" | "none", or a named function
    (given as one of the tools, its name, or OpenAI's dict)."""
    if choice is None:
        return "auto"
    names = {s.name for s in specs}
    if isinstance(choice, str) and choice in TOOL_CHOICES:
        return choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
    elif isinstance(choice, str):
        name = choice
    else:
        name = next((s.name for s in specs if s.fn is choice or s.model is choice), None)
        name = name or getattr(choice, "__name__", None)
    if name not in names:
        raise ProgramError(
            f"{where}: tool_choice {choice!r} is not 'auto', 'required', 'none' or one of the "
            f"tools {sorted(names)}"
        )
    return {"type": "function", "function": {"name": name}}


# ---- what a tool gen stores ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolSet:
    """The tools of one gen (`Gen.result`): reads the backend's calls back as `ToolCall`s."""

    specs: tuple[ToolSpec, ...]

    @property
    def name(self) -> str:
        return "tools[" + ", ".join(s.name for s in self.specs) + "]"

    def get(self, name: str) -> ToolSpec:
        return next(s for s in self.specs if s.name == name)

    def calls(self, raw: list[dict[str, Any]], var: str | None) -> list[ToolCall]:
        """The backend's OpenAI-shaped calls, validated; a `ProgramError` naming the variable
        and the tool when one does not validate (a strict backend never writes one)."""
        out = []
        known = {s.name for s in self.specs}
        for i, c in enumerate(raw):
            fn = c.get("function") or {}
            name, text = fn.get("name"), fn.get("arguments") or "{}"
            if name not in known:
                raise ProgramError(f"gen({var!r}): the backend called unknown tool {name!r}")
            try:
                args = json.loads(text) if isinstance(text, str) else dict(text)
                instance = self.get(name).validate(args)
            except ValueError as exc:
                raise ProgramError(
                    f"gen({var!r}): the arguments {text!r} of the call to tool {name} do not "
                    f"validate: {exc}"
                ) from exc
            values = {k: getattr(instance, k) for k in type(instance).model_fields}
            raw_args = text if isinstance(text, str) else json.dumps(text)
            out.append(ToolCall(c.get("id") or f"call_{i}", name, values, instance, raw_args))
        return out


def check_tool_gen(name: Any, tools: Any, params: dict[str, Any]) -> None:
    """What a gen with tools cannot be combined with (each named)."""
    where = f"gen({name!r})"
    for key in ("regex", "json_schema", "choices", "dtype", "grammar", "ebnf", "structural_tag"):
        if params.get(key) is not None:
            raise ProgramError(f"{where}: tools cannot be combined with {key}")
    for key in ("n", "stop_regex", "logprob_start_len"):
        if params.get(key) is not None:
            raise ProgramError(f"{where}: {key} is not supported with tools")


def tool_params(name: Any, tools: Any, tool_choice: Any) -> tuple[dict[str, Any], ToolSet]:
    """The gen params (`tools` as OpenAI entries, `tool_choice`) and the gen's `ToolSet`."""
    where = f"gen({name!r})"
    specs = tool_specs(tools, where)
    choice = tool_choice_value(tool_choice, specs, where)
    return {"tools": [s.openai() for s in specs], "tool_choice": choice}, ToolSet(tuple(specs))


# ---- running a tool gen (the interpreter calls these) ----------------------------------------


def conversation(state: Any, where: str) -> list[dict[str, Any]]:
    """The messages a tool gen continues: it must open its assistant turn (the backend renders
    the conversation with the tools through the chat template, as a chat API does)."""
    open_role = state._open_role
    if open_role is None or open_role[0] != "assistant" or state._text[open_role[1] :]:
        raise ProgramError(
            f"{where}: a gen with tools must come right after sgl.assistant( opens (the "
            "backend renders the conversation with the tools through the chat template)"
        )
    if not state._messages:
        raise ProgramError(f"{where}: a gen with tools needs a user turn before it")
    return [dict(m) for m in state._messages]


def store_tool_answer(state: Any, gen: Any, output: Any) -> None:
    """Append the answer's text and set the variable: the calls, or the text answer."""
    toolset: ToolSet = gen.result
    calls = toolset.calls(output.tool_calls or [], gen.name)
    forced = gen.params.get("tool_choice") not in ("auto", "none")
    if forced and not calls:  # the constraint forced a call: it was cut short
        cut = " (cut at max_tokens: raise max_tokens)" if output.finish_reason == "length" else ""
        raise ProgramError(
            f"gen({gen.name!r}): tool_choice {gen.params['tool_choice']!r} but the answer "
            f"holds no complete call{cut}: {output.text[:80]!r}"
        )
    state._emit(output.text, gen.name)
    state._tool_turn = (output.content, calls)  # the assistant message gets them at its end
    if gen.name is not None:
        value = calls if calls else (output.content or "")
        state.set_var(gen.name, value, output.meta())
        state._close_var(gen.name)


def assistant_message(state: Any, content: str) -> dict[str, Any]:
    """The closing assistant turn's message, with the calls of a tool gen in it."""
    turn = getattr(state, "_tool_turn", None)
    if turn is None:
        return {"role": "assistant", "content": content}
    state._tool_turn = None
    text, calls = turn
    if not calls:
        return {"role": "assistant", "content": text or ""}
    return {"role": "assistant", "content": text or "", "tool_calls": [c.message() for c in calls]}


# ---- tool_loop (the primitive is in primitives.py; this runs it) ------------------------------


@dataclass(frozen=True, slots=True)
class Turns:
    """What the loop needs of the interpreter, handed in by it (the interpreter runs the loop;
    this module does not import it): open / close a role, run a gen (sync and async)."""

    begin_role: Callable[[Any, str], None]
    end_role: Callable[[Any, str], None]
    run_gen: Callable[[Any, Any], None]
    run_gen_async: Callable[[Any, Any], Any]


def _turn_gen(loop: ToolLoop, turn: int) -> Any:
    first, later, last = loop.gens
    if turn == loop.max_turns - 1 and loop.on_max_turns == "answer":
        return last
    return first if turn == 0 else later


def run_loop(state: Any, loop: ToolLoop, turns: Turns) -> None:
    made: list[ToolCall] = []
    for turn in range(loop.max_turns):
        gen = _turn_gen(loop, turn)
        turns.begin_role(state, "assistant")
        turns.run_gen(state, gen)
        turns.end_role(state, "assistant")
        if _after_turn(state, loop, gen, made, turns, _run_call):
            return
    _out_of_turns(state, loop, made)


async def run_loop_async(state: Any, loop: ToolLoop, turns: Turns) -> None:
    made: list[ToolCall] = []
    for turn in range(loop.max_turns):
        gen = _turn_gen(loop, turn)
        turns.begin_role(state, "assistant")
        await turns.run_gen_async(state, gen)
        turns.end_role(state, "assistant")
        value = state._vars.get(loop.name)
        if isinstance(value, list) and value and all(isinstance(c, ToolCall) for c in value):
            for call in value:
                if gen.result.get(call.name).fn is not None:
                    call.result = await _run_call_async(gen.result.get(call.name), call)
        if _after_turn(state, loop, gen, made, turns, None):
            return
    _out_of_turns(state, loop, made)


def _after_turn(
    state: Any, loop: ToolLoop, gen: Any, made: list[ToolCall], turns: Turns, run: Any
) -> bool:
    """Run (when `run` is given) and record this turn's calls; True when the loop is done."""
    value = state._vars.get(loop.name)
    if not (isinstance(value, list) and value and all(isinstance(c, ToolCall) for c in value)):
        _set(state, loop.calls, made)
        return True  # a text answer
    answer = None
    for call in value:
        spec = gen.result.get(call.name)
        made.append(call)
        if spec.fn is None:  # a model tool: its validated instance is the answer
            answer = call.instance if answer is None else answer
            continue
        if run is not None:
            call.result = run(spec, call)
        _tool_message(state, call, turns)
    _set(state, loop.calls, made)
    if answer is not None:
        _set(state, loop.name, answer)
        return True
    return False


def _out_of_turns(state: Any, loop: ToolLoop, made: list[ToolCall]) -> None:
    _set(state, loop.calls, made)
    raise ProgramError(
        f"tool_loop(): the model was still calling tools after max_turns={loop.max_turns} "
        f"turns ({len(made)} calls); raise max_turns or pass on_max_turns='answer'"
    )


def _set(state: Any, name: str, value: Any) -> None:
    state.set_var(name, value)
    state._close_var(name)


def _run_call(spec: ToolSpec, call: ToolCall) -> Any:
    try:
        result = spec.fn(**call.arguments)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        return result
    except Exception as exc:
        raise ProgramError(f"tool_loop(): tool {spec.name} raised {exc!r}") from exc


async def _run_call_async(spec: ToolSpec, call: ToolCall) -> Any:
    try:
        result = spec.fn(**call.arguments)
        return await result if inspect.isawaitable(result) else result
    except Exception as exc:
        raise ProgramError(f"tool_loop(): tool {spec.name} raised {exc!r}") from exc


async def _awaited(result: Any) -> Any:
    return await result


def result_text(result: Any) -> str:
    """A tool's result as the text of its `tool` message (JSON unless it is a string)."""
    if isinstance(result, str):
        return result
    if hasattr(result, "model_dump_json"):
        return result.model_dump_json()
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


def _tool_message(state: Any, call: ToolCall, turns: Turns) -> None:
    """The call's result as a `tool` message; in the text, a user turn naming the tool (the
    form the server gives templates without tool turns; a tool gen re-renders the messages)."""
    text = result_text(call.result)
    turns.begin_role(state, "user")
    state._emit(f"Tool result ({call.name}): {text}")
    state._open_role = None
    state._emit(state.template.end("user"))
    message = {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text}
    state._messages.append(message)
