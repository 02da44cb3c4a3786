"""Executes expressions on a `ProgramState` against its backend.

The program's own Python code is the control flow: each `s += expr` arrives here as it
runs, so a program can read `s[name]` and branch on it. Text and role markers change only
the state; `gen` makes one generate call with the whole text as the prompt (the prefix
cache makes the repeated part free); `select` scores every choice in one `score` call.
`append_async` is the same on an event loop (the backend's `agenerate` / `ascore`); both share
every step but the call itself.
"""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from . import tools
from .backend.base import Backend, GenChunk, GenOutput, NoPromptLogprobs
from .chat_template import ChatTemplate
from .errors import ProgramError
from .ir import ArgRef, Expr, Gen, RoleBegin, RoleEnd, Select, Text, ToolLoop, VarRef, flatten
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
            case ToolLoop():
                tools.run_loop(state, leaf, _TURNS)
            case VarRef(name):
                state._emit(str(state._vars[name]))
            case ArgRef(name):
                raise ProgramError(f"argument {name!r} reached the interpreter unbound")
            case _:
                raise ProgramError(f"cannot execute {leaf!r}")


async def append_async(state: ProgramState, expr: Expr) -> None:
    """`append` on the event loop: a gen or select awaits the backend's async calls."""
    for leaf in flatten(expr):
        match leaf:
            case Gen():
                await run_gen_async(state, leaf)
            case Select():
                await run_select_async(state, leaf)
            case ToolLoop():
                await tools.run_loop_async(state, leaf, _TURNS)
            case _:
                append(state, leaf)


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
    message = tools.assistant_message(state, content) if role == "assistant" else None
    state._messages.append(message or {"role": role, "content": content})
    state._emit(state.template.end(role))


def run_gen(state: ProgramState, gen: Gen) -> None:
    if "tools" in gen.params:  # the conversation goes to the backend's tool machinery
        messages, params = _tool_call(state, gen)
        tools.store_tool_answer(state, gen, state.backend.chat(messages, params))
        return
    prompt, params, n, patterns = _gen_call(state, gen)
    if n > 1:
        # SGLang's n: n samples, the variable is their list and the first is appended
        with ThreadPoolExecutor(min(n, 16), thread_name_prefix="sgl-n") as pool:
            outputs = list(pool.map(lambda _: _generate(state, prompt, params, patterns), range(n)))
        _store_samples(state, gen, outputs)
        return
    if state.stream or patterns:
        stream = _StreamedGen(state, patterns, gen.name)
        chunks = state.backend.generate_stream(prompt, params)
        try:
            for chunk in chunks:
                if stream.feed(chunk):
                    break
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        text, output = stream.result()
    else:
        output = state.backend.generate(prompt, params)
        text = output.text
        state._emit(text, gen.name)
    _store(state, gen, text, output)


async def run_gen_async(state: ProgramState, gen: Gen) -> None:
    """`run_gen` on the event loop: the backend's async calls, n samples gathered."""
    if "tools" in gen.params:
        messages, params = _tool_call(state, gen)
        tools.store_tool_answer(state, gen, await state.backend.achat(messages, params))
        return
    prompt, params, n, patterns = _gen_call(state, gen)
    if n > 1:
        calls = [_generate_async(state, prompt, params, patterns) for _ in range(n)]
        _store_samples(state, gen, list(await asyncio.gather(*calls)))
        return
    if state.stream or patterns:
        stream = _StreamedGen(state, patterns, gen.name)
        chunks = state.backend.agenerate_stream(prompt, params)
        try:
            async for chunk in chunks:
                if stream.feed(chunk):
                    break
        finally:
            await chunks.aclose()
        text, output = stream.result()
    else:
        output = await state.backend.agenerate(prompt, params)
        text = output.text
        state._emit(text, gen.name)
    _store(state, gen, text, output)


def _gen_call(
    state: ProgramState, gen: Gen
) -> tuple[str, dict[str, Any], int, list[re.Pattern[str]]]:
    """The prompt, the backend's params, `n` and the `stop_regex` patterns of one gen."""
    params: dict[str, Any] = {**state.defaults, **gen.params}
    n = params.pop("n", 1)
    patterns = [re.compile(p) for p in params.pop("stop_regex", None) or ()]
    _healing(state, params)
    return state._text, params, n, patterns


def _healing(state: ProgramState, params: dict[str, Any]) -> None:
    """Token healing (docs/programs.md): asked of the backend for a gen after text the program
    wrote, unless the gen or the run says `token_healing=False`; not at the start of the text
    nor right after a role's begin or end marker (the template's own boundaries), unless the
    gen asks for it. Only a backend that heals (`heals_tokens`: the in-process engine, our
    server) is sent the option; the others generate after the text as it is."""
    wanted = params.pop("token_healing", None)
    if wanted is None:
        wanted = _after_written_text(state)
    if wanted and getattr(state.backend, "heals_tokens", False):
        params["token_healing"] = True


def _after_written_text(state: ProgramState) -> bool:
    text = state._text
    if not text:
        return False
    role = state._open_role
    if role is not None:
        return role[1] < len(text)  # something was written after the role's begin marker
    if state._messages:
        end = state.template.end(state._messages[-1]["role"])
        return not (end and text.endswith(end))
    return True


def _tool_call(state: ProgramState, gen: Gen) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The conversation and the params of a gen with tools (run options apply; n and
    stop_regex do not: refused when the gen sets them)."""
    messages = tools.conversation(state, f"gen({gen.name!r})")
    params = {**state.defaults, **gen.params}
    for key in ("n", "stop_regex", "token_healing"):  # text-prompt options
        params.pop(key, None)
    return messages, params


def _value(gen: Gen, text: str, output: GenOutput | None) -> Any:
    """The variable's value: the text, or with `gen(type=T)` the T it parses to."""
    if gen.result is None:
        return text
    reason = output.finish_reason if output is not None else None
    return gen.result.parse(text, gen.name, reason)


def _store(state: ProgramState, gen: Gen, text: str, output: GenOutput | None) -> None:
    if gen.name is not None:
        value = _value(gen, text, output)
        state.set_var(gen.name, value, output.meta() if output is not None else None)
        state._close_var(gen.name)


def _store_samples(state: ProgramState, gen: Gen, outputs: list[GenOutput]) -> None:
    state._emit(outputs[0].text, gen.name)
    if gen.name is not None:
        values = [_value(gen, o.text, o) for o in outputs]
        state.set_var(gen.name, values, [o.meta() for o in outputs])
        state._close_var(gen.name)


def _generate(
    state: ProgramState, prompt: str, params: dict[str, Any], patterns: list[re.Pattern[str]]
) -> GenOutput:
    if not patterns:
        return state.backend.generate(prompt, params)
    stream = _StreamedGen(state, patterns, None, emit=False)
    chunks = state.backend.generate_stream(prompt, params)
    try:
        for chunk in chunks:
            if stream.feed(chunk):
                break
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    return stream.result()[1]


async def _generate_async(
    state: ProgramState, prompt: str, params: dict[str, Any], patterns: list[re.Pattern[str]]
) -> GenOutput:
    if not patterns:
        return await state.backend.agenerate(prompt, params)
    stream = _StreamedGen(state, patterns, None, emit=False)
    chunks = state.backend.agenerate_stream(prompt, params)
    try:
        async for chunk in chunks:
            if stream.feed(chunk):
                break
    finally:
        await chunks.aclose()
    return stream.result()[1]


class _StreamedGen:
    """A generation read as a stream: appended to the state piece by piece when it streams,
    and, with `stop_regex` patterns, ended where one first matches (the text is cut before
    the match, finish_reason "stop", `matched` the matched text, as SGLang does); the caller
    then closes the stream, which aborts the rest of the generation."""

    def __init__(
        self,
        state: ProgramState,
        patterns: list[re.Pattern[str]],
        name: str | None,
        emit: bool = True,
    ) -> None:
        self.state, self.patterns, self.name, self.emit = state, patterns, name, emit
        self.text, self.emitted, self.output = "", 0, None
        self.matched = False

    def feed(self, chunk: GenChunk) -> bool:
        """Take one chunk; True when a stop regex matched (read no more)."""
        self.text += chunk.text_delta
        self.output = chunk.output or self.output
        match = _first_match(self.patterns, self.text) if self.patterns else None
        if match is not None:
            cut = max(match.start(), self.emitted)  # what was already appended stays
            if self.emit:
                self.state._emit(self.text[self.emitted : cut], self.name)
            self.text = self.text[:cut]
            done = self.output or GenOutput(self.text, "stop")
            done.text, done.finish_reason, done.matched_stop = self.text, "stop", match.group(0)
            self.output, self.matched = done, True
            return True
        if self.emit and self.state.stream:
            self.state._emit(self.text[self.emitted :], self.name)
            self.emitted = len(self.text)
        return False

    def result(self) -> tuple[str, GenOutput]:
        """The text and output once the stream ended (or matched)."""
        if not self.matched and self.emit:
            self.state._emit(self.text[self.emitted :], self.name)
        output = self.output if self.output is not None else GenOutput(self.text, "stop")
        return self.text, output


def _first_match(patterns: list[re.Pattern[str]], text: str) -> re.Match[str] | None:
    found = [m for m in (p.search(text) for p in patterns) if m is not None]
    return min(found, key=lambda m: m.start()) if found else None


def run_select(state: ProgramState, sel: Select) -> None:
    if not state.backend.scores_text:  # no prompt log-probs: a constrained choice instead
        _store_choice(state, sel, state.backend.generate(*_choice_call(state, sel)))
        return
    prompt, continuations, neutral = _select_call(state, sel)
    try:
        token_logprobs = state.backend.score(prompt, continuations)
    except NoPromptLogprobs:  # the server returned none: a constrained choice instead
        _store_choice(state, sel, state.backend.generate(*_choice_call(state, sel)))
        return
    unconditional = None if neutral is None else state.backend.score(neutral, sel.choices)
    _choose(state, sel, token_logprobs, unconditional)


async def run_select_async(state: ProgramState, sel: Select) -> None:
    """`run_select` on the event loop (both scoring calls at once when two are needed)."""
    if not state.backend.scores_text:
        _store_choice(state, sel, await state.backend.agenerate(*_choice_call(state, sel)))
        return
    prompt, continuations, neutral = _select_call(state, sel)
    calls = [state.backend.ascore(prompt, continuations)]
    if neutral is not None:
        calls.append(state.backend.ascore(neutral, sel.choices))
    try:
        scored = await asyncio.gather(*calls)
    except NoPromptLogprobs:
        _store_choice(state, sel, await state.backend.agenerate(*_choice_call(state, sel)))
        return
    _choose(state, sel, scored[0], scored[1] if neutral is not None else None)


# the select methods a constrained choice answers (it picks greedily, as "greedy" does and
# as the mean log-likelihood nearly always agrees); the others need the choices' scores
_CHOICE_METHODS = ("token_length_normalized", "greedy")


def _choice_call(state: ProgramState, sel: Select) -> tuple[str, dict[str, Any]]:
    """`select` on a backend that cannot score text: `gen(choices=..., temperature=0)`."""
    method = getattr(sel.method, "name", sel.method)
    if method not in _CHOICE_METHODS:
        raise ProgramError(
            f"select({sel.name!r}): {type(state.backend).__name__} cannot score choices (no "
            f"prompt log-probs), and method {method!r} needs their scores; use the default "
            "method (answered by a constrained choice there)"
        )
    return state._text, {"choices": list(sel.choices), "temperature": 0.0}


def _store_choice(state: ProgramState, sel: Select, output: GenOutput) -> None:
    if output.text not in sel.choices:
        raise ProgramError(
            f"select({sel.name!r}): the constrained choice answered {output.text!r}, not one of "
            f"the choices (finish_reason {output.finish_reason!r})"
        )
    state._emit(output.text, sel.name)
    if sel.name is not None:
        meta = {"choices": sel.choices, "index": sel.choices.index(output.text),
                "method": "constrained_choice", **output.meta()}  # fmt: skip
        state.set_var(sel.name, output.text, meta)
        state._close_var(sel.name)


def _select_call(state: ProgramState, sel: Select) -> tuple[str, list[str], str | None]:
    """The prompt and continuations to score, and the neutral prompt when the method needs
    the choices' unconditional scores too."""
    backend = state.backend
    # Trailing spaces of the text move into the choices: "Label:" + " True" tokenizes as
    # the model saw in training, "Label: " + "True" does not (and scores far lower).
    prompt = state._text.rstrip(" ")
    spaces = state._text[len(prompt) :]
    # a backend cannot score after nothing: an empty state scores after the neutral prompt
    prompt = prompt or backend.unconditional_prompt()
    neutral = None
    if sel.method.needs_unconditional:
        # "no context" inside a role block still means: right after that role's begin marker
        role = state._open_role[0] if state._open_role else None
        neutral = state.template.begin(role) if role else backend.unconditional_prompt()
    return prompt, [spaces + c for c in sel.choices], neutral


def _choose(
    state: ProgramState,
    sel: Select,
    token_logprobs: list[list[float]],
    unconditional: list[list[float]] | None,
) -> None:
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


_TURNS = tools.Turns(begin_role, end_role, run_gen, run_gen_async)
