"""Token healing in programs: a `gen` after text the program wrote heals the text's end (the
engine's `token_healing`), off with `token_healing=False` on the gen or the run, and never
right after a role marker. The oracle is the engine itself: the program's value is what
`Engine.generate` gives for the same text with healing on (or off)."""

from __future__ import annotations

import re

import pytest

import sgl_dsl as sgl
from sgl_dsl.errors import ProgramError
from tests.support.dsl_backends import FakeBackend
from tests.support.tiny_models import smollm_tokenizer

GREEDY = {"temperature": 0, "max_tokens": 6}
URL = "The URL is http:"


@sgl.function
def after_text(s):
    s += URL + sgl.gen("x", **GREEDY)


@sgl.function
def after_text_unhealed(s):
    s += URL + sgl.gen("x", token_healing=False, **GREEDY)


def _engine(runtime, text: str, **kw):
    return runtime.engine.generate(text, max_new_tokens=6, temperature=0, **kw)


def test_a_gen_after_text_heals_by_default(runtime):
    state = after_text.run(backend=runtime)
    healed = _engine(runtime, URL, token_healing=True)
    assert state["x"] == healed.text
    assert state.text() == URL + healed.text
    meta = state.get_meta_info("x")
    assert meta["prompt_tokens"] == len(runtime.tokenizer(URL).input_ids) - 1


@pytest.mark.parametrize(
    "where",
    [
        pytest.param("gen", id="on-the-gen"),
        pytest.param("run", id="for-the-run"),
    ],
)
def test_token_healing_false_turns_it_off(runtime, where):
    if where == "gen":
        state = after_text_unhealed.run(backend=runtime)
    else:
        state = after_text.run(backend=runtime, token_healing=False)
    assert state["x"] == _engine(runtime, URL).text
    assert state.get_meta_info("x")["prompt_tokens"] == len(runtime.tokenizer(URL).input_ids)


def test_the_gens_own_setting_wins_over_the_runs(runtime):
    @sgl.function
    def program(s):
        s += URL + sgl.gen("x", token_healing=True, **GREEDY)

    state = program.run(backend=runtime, token_healing=False)
    assert state["x"] == _engine(runtime, URL, token_healing=True).text


def test_no_healing_right_after_a_role_marker(runtime):
    @sgl.function
    def chat(s):
        s += sgl.user("Say hi.")
        s += sgl.assistant(sgl.gen("x", **GREEDY))

    state = chat.run(backend=runtime)
    prompt = runtime.tokenizer.apply_chat_template(
        state.messages()[:2], tokenize=False, add_generation_prompt=True
    )
    assert state.get_meta_info("x")["prompt_tokens"] == len(runtime.tokenizer(prompt).input_ids)


def test_text_written_inside_a_role_heals(runtime):
    @sgl.function
    def chat(s):
        with s.assistant():
            s += URL + sgl.gen("x", **GREEDY)

    state = chat.run(backend=runtime)
    prompt = state.text()[: state.text().index(URL) + len(URL)]
    assert state["x"] == _engine(runtime, prompt, token_healing=True).text


def test_a_constrained_gen_matches_after_the_healed_prefix(runtime):
    @sgl.function
    def program(s):
        s += URL + sgl.gen("x", regex=r"//(example|test)\.com", temperature=0, max_tokens=16)

    state = program.run(backend=runtime)
    assert re.fullmatch(r"//(example|test)\.com", state["x"])
    assert state.text() == URL + state["x"]


def test_a_typed_gen_parses_the_text_after_the_healed_prefix(runtime):
    @sgl.function
    def program(s):
        s += "The count is " + sgl.gen("n", type=int, temperature=0, max_tokens=8)

    state = program.run(backend=runtime)
    assert isinstance(state["n"], int)
    assert state.text() == "The count is " + str(state["n"])


def test_a_bad_token_healing_value_is_refused_at_the_gen():
    with pytest.raises(ProgramError, match="token_healing"):
        sgl.gen("x", token_healing="yes")


# ---- when a gen asks for healing (a scripted backend records what it is sent) ---------------
class HealingFake(FakeBackend):
    heals_tokens = True


def _sent(program, backend, **run_kw) -> list[bool]:
    program.run(backend=backend, **run_kw)
    return [bool(params.get("token_healing")) for kind, _, params in backend.calls
            if kind == "generate"]  # fmt: skip


@sgl.function
def text_then_gens(s):
    s += "Q: 1+1?\nA:" + sgl.gen("a", max_tokens=2)
    s += sgl.gen("b", max_tokens=2)  # right after a value: text too
    s += "\n" + sgl.gen("c", max_tokens=2, token_healing=False)


@sgl.function
def role_gens(s):
    s += sgl.user("hi")
    s += sgl.assistant(sgl.gen("a", max_tokens=2))
    s += sgl.gen("b", max_tokens=2)  # right after the role's end marker
    with s.assistant():
        s += "Sure:" + sgl.gen("c", max_tokens=2)


@sgl.function
def starts_with_a_gen(s):
    s += sgl.gen("a", max_tokens=2)
    s += sgl.gen("b", max_tokens=2, token_healing=True)


@pytest.mark.parametrize(
    ("program", "run_kw", "expected"),
    [
        pytest.param(text_then_gens, {}, [True, True, False], id="after-text"),
        pytest.param(
            text_then_gens, {"token_healing": False}, [False, False, False], id="run-off"
        ),  # fmt: skip
        pytest.param(role_gens, {}, [False, False, True], id="role-markers"),
        pytest.param(starts_with_a_gen, {}, [False, True], id="start-and-explicit"),
    ],
)
def test_which_gens_ask_for_healing(program, run_kw, expected):
    assert _sent(program, HealingFake(), **run_kw) == expected


def test_a_backend_that_cannot_heal_is_never_sent_the_option():
    backend = FakeBackend()
    text_then_gens.run(backend=backend)
    assert not any("token_healing" in params for kind, _, params in backend.calls
                   if kind == "generate")  # fmt: skip


def test_programs_on_our_server_heal(server):
    backend = sgl.RuntimeEndpoint(server.url)
    assert backend.heals_tokens
    state = after_text.run(backend=backend)
    ids = len(smollm_tokenizer()(URL).input_ids)
    assert state.get_meta_info("x")["prompt_tokens"] == ids - 1
    assert state.text() == URL + state["x"]
