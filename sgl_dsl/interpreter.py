"""Executes expressions on a `ProgramState` against its backend.

The program's own Python code is the control flow: each `s += expr` arrives here as it
runs, so a program can read `s[name]` and branch on it. Text and role markers change only
the state; `gen` makes one generate call with the whole text as the prompt (the prefix
cache makes the repeated part free); `select` scores every choice in one `score` call.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from .backend.base import Backend, GenOutput
from .chat_template import ChatTemplate
from .errors import ProgramError
from .ir import ArgRef, Expr, Gen, RoleBegin, RoleEnd, Select, Text, VarRef, flatten
from .select_methods import ChoiceScores


class ProgramState(Protocol):
    """What the interpreter reads and writes of a running program (`state.ProgramState` is
    one): its backend and options, and the text, messages and variables it appends to."""

    backend: Backend
    template: ChatTemplate
    defaults: dict[str, Any]  # gen() options a gen does not set itself
    stream: bool
    _text: str
    _vars: dict[str, Any]
    _messages: list[dict[str, str]]
    _open_role: tuple[str, int] | None  # (role, text offset of its content)

    def set_var(self, name: str, value: Any, meta: Any = None) -> None: ...

    def _emit(self, text: str, var: str | None = None) -> None: ...

    def _close_var(self, name: str) -> None: ...


def append(state: ProgramState, expr: Expr) -> None:
    for leaf in flatten(expr):
        match leaf:
            case Text(text):
                state._emit(text)
            case RoleBegin(role):
                begin_role(state, role)
            case RoleEnd(role):
                end_role(state, role)
            case Gen():
                run_gen(state, leaf)
            case Select():
                run_select(state, leaf)
            case VarRef(name):
                state._emit(str(state._vars[name]))
            case ArgRef(name):
                raise ProgramError(f"argument {name!r} reached the interpreter unbound")
            case _:
                raise ProgramError(f"cannot execute {leaf!r}")


def begin_role(state: ProgramState, role: str) -> None:
    if state._open_role is not None:
        raise ProgramError(
            f"{role} block opened inside the open {state._open_role[0]} block; close it first"
        )
    template = state.template
    if not state._text and not state._messages:
        # the first turn of a conversation gets what the template adds before it
        prefix = template.first_turn_prefix(role)
        if prefix and template.default_system is not None:
            state._messages.append({"role": "system", "content": template.default_system})
        state._emit(prefix)
    state._emit(template.begin(role))
    state._open_role = (role, len(state._text))


def end_role(state: ProgramState, role: str) -> None:
    if state._open_role is None or state._open_role[0] != role:
        open_role = state._open_role[0] if state._open_role else "no"
        raise ProgramError(f"end of {role} block while {open_role} block is open")
    content = state._text[state._open_role[1] :]
    state._open_role = None
    state._messages.append({"role": role, "content": content})
    state._emit(state.template.end(role))


def run_gen(state: ProgramState, gen: Gen) -> None:
    params: dict[str, Any] = {**state.defaults, **gen.params}
    n = params.pop("n", 1)
    patterns = [re.compile(p) for p in params.pop("stop_regex", None) or ()]
    prompt = state._text
    if n > 1:
        # SGLang's n: n samples, the variable is their list and the first is appended
        with ThreadPoolExecutor(min(n, 16), thread_name_prefix="sgl-n") as pool:
            outputs = list(pool.map(lambda _: _generate(state, prompt, params, patterns), range(n)))
        state._emit(outputs[0].text, gen.name)
        if gen.name is not None:
            state.set_var(gen.name, [o.text for o in outputs], [o.meta() for o in outputs])
            state._close_var(gen.name)
        return
    if state.stream or patterns:
        text, output = _stream_gen(state, prompt, params, patterns, gen.name)
    else:
        output = state.backend.generate(prompt, params)
        text = output.text
        state._emit(text, gen.name)
    if gen.name is not None:
        state.set_var(gen.name, text, output.meta() if output is not None else None)
        state._close_var(gen.name)


def _generate(
    state: ProgramState, prompt: str, params: dict[str, Any], patterns: list[re.Pattern[str]]
) -> GenOutput:
    if not patterns:
        return state.backend.generate(prompt, params)
    text, output = _stream_gen(state, prompt, params, patterns, None, emit=False)
    return output


def _stream_gen(
    state: ProgramState,
    prompt: str,
    params: dict[str, Any],
    patterns: list[re.Pattern[str]],
    name: str | None,
    emit: bool = True,
) -> tuple[str, GenOutput]:
    """Generate streamed; with `stop_regex` patterns, end where one first matches (the text
    is cut before the match, finish_reason "stop", `matched` the matched text, as SGLang
    does) and close the stream, which aborts the rest of the generation."""
    text, emitted, output = "", 0, None
    chunks = state.backend.generate_stream(prompt, params)
    try:
        for chunk in chunks:
            text += chunk.text_delta
            output = chunk.output or output
            match = _first_match(patterns, text) if patterns else None
            if match is not None:
                cut = max(match.start(), emitted)  # what was already appended stays
                if emit:
                    state._emit(text[emitted:cut], name)
                text = text[:cut]
                done = output or GenOutput(text, "stop")
                done.text, done.finish_reason, done.matched_stop = text, "stop", match.group(0)
                return text, done
            if emit and state.stream:
                state._emit(text[emitted:], name)
                emitted = len(text)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    if emit:
        state._emit(text[emitted:], name)
    if output is None:
        output = GenOutput(text, "stop")
    return text, output


def _first_match(patterns: list[re.Pattern[str]], text: str) -> re.Match[str] | None:
    found = [m for m in (p.search(text) for p in patterns) if m is not None]
    return min(found, key=lambda m: m.start()) if found else None


def run_select(state: ProgramState, sel: Select) -> None:
    backend = state.backend
    # Trailing spaces of the text move into the choices: "Label:" + " True" tokenizes as
    # the model saw in training, "Label: " + "True" does not (and scores far lower).
    prompt = state._text.rstrip(" ")
    spaces = state._text[len(prompt) :]
    # a backend cannot score after nothing: an empty state scores after the neutral prompt
    prompt = prompt or backend.unconditional_prompt()
    token_logprobs = backend.score(prompt, [spaces + c for c in sel.choices])
    unconditional = None
    if sel.method.needs_unconditional:
        # "no context" inside a role block still means: right after that role's begin marker
        role = state._open_role[0] if state._open_role else None
        neutral = state.template.begin(role) if role else backend.unconditional_prompt()
        unconditional = backend.score(neutral, sel.choices)
    scores = ChoiceScores(sel.choices, token_logprobs, unconditional)
    normalized = [sum(lp) / max(len(lp), 1) for lp in token_logprobs]
    index = sel.method(scores)
    if not 0 <= index < len(sel.choices):
        raise ProgramError(f"select({sel.name!r}): method returned index {index}")
    chosen = sel.choices[index]
    state._emit(chosen, sel.name)
    if sel.name is not None:
        meta = {
            "normalized_prompt_logprobs": normalized,  # SGLang's name: mean token log-prob
            "choices": sel.choices,
            "index": index,
            "token_logprobs": token_logprobs,
            "unconditional_token_logprobs": unconditional,
        }
        state.set_var(sel.name, chosen, meta)
        state._close_var(sel.name)
