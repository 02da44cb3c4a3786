"""Executes expressions on a `ProgramState` against its backend.

The program's own Python code is the control flow: each `s += expr` arrives here as it
runs, so a program can read `s[name]` and branch on it. Text and role markers change only
the state; `gen` makes one generate call with the whole text as the prompt (the prefix
cache makes the repeated part free); `select` scores every choice in one `score` call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ProgramError
from .ir import ArgRef, Expr, Gen, RoleBegin, RoleEnd, Select, Text, VarRef, flatten
from .select_methods import ChoiceScores

if TYPE_CHECKING:
    from .state import ProgramState


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
    prompt = state._text
    if state.stream:
        pieces, output = [], None
        for chunk in state.backend.generate_stream(prompt, params):
            pieces.append(chunk.text_delta)
            state._emit(chunk.text_delta, gen.name)
            output = chunk.output or output
        text = "".join(pieces)
    else:
        output = state.backend.generate(prompt, params)
        text = output.text
        state._emit(text, gen.name)
    if gen.name is not None:
        state.set_var(gen.name, text, output.meta() if output is not None else None)
        state._close_var(gen.name)


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
    index = sel.method(scores)
    if not 0 <= index < len(sel.choices):
        raise ProgramError(f"select({sel.name!r}): method returned index {index}")
    chosen = sel.choices[index]
    state._emit(chosen, sel.name)
    if sel.name is not None:
        meta = {
            "choices": sel.choices,
            "index": index,
            "token_logprobs": token_logprobs,
            "unconditional_token_logprobs": unconditional,
        }
        state.set_var(sel.name, chosen, meta)
        state._close_var(sel.name)
