"""The DSL on the real engine with a tiny random Llama (SmolLM2's tokenizer and template).

The model's text is noise, so these tests check what does not depend on it: the chat
template, messages, streaming, caching of hoisted and forked prefixes, batched select,
meta info, and errors staying on their own state.
"""

from __future__ import annotations

import pytest

import sgl_dsl as sgl

NOISE = {"temperature": 0, "ignore_eos": True}  # random weights: fixed length, greedy


@sgl.function
def two_turns(s, question):
    s += sgl.system("You are terse.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=6, **NOISE))
    with s.user():
        s += "And why?"
    with s.assistant():
        s += sgl.gen("why", max_tokens=4, **NOISE)


def test_text_is_the_tokenizers_own_template_render(runtime):
    state = two_turns.run(question="Capital of France?", backend=runtime)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[1]["content"] == "Capital of France?"
    assert messages[2]["content"] == state["answer"]
    assert state.text() == runtime.tokenizer.apply_chat_template(messages, tokenize=False)


def test_default_system_prompt_comes_from_the_template(runtime):
    @sgl.function
    def no_system(s):
        s += sgl.user("hi")

    state = no_system.run(backend=runtime)
    assert state.messages()[0] == {
        "role": "system",
        "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
    }
    assert state.text() == runtime.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )


def test_gen_meta_info_has_usage(runtime):
    state = two_turns.run(question="Q?", backend=runtime)
    meta = state.get_meta_info("answer")
    assert meta["completion_tokens"] == 6 and meta["finish_reason"] == "length"
    prompt = runtime.tokenizer.apply_chat_template(
        state.messages()[:2], tokenize=False, add_generation_prompt=True
    )
    assert meta["prompt_tokens"] == len(runtime.tokenizer(prompt).input_ids)
    second = state.get_meta_info("why")
    # the second turn's prompt starts with the first turn, which the radix cache kept
    assert second["cached_tokens"] >= meta["prompt_tokens"] - 16


def test_streamed_pieces_make_up_the_variable(runtime):
    @sgl.function
    def prog(s):
        s += "Once upon a time" + sgl.gen("story", max_tokens=8, **NOISE)

    state = prog.run(backend=runtime, stream=True)
    pieces = list(state.text_iter("story"))
    assert len(pieces) > 1
    assert "".join(pieces) == state["story"]
    assert state.text() == "Once upon a time" + state["story"]


def test_run_batch_hoists_the_prefix_into_the_cache(runtime):
    @sgl.function
    def prog(s, topic):
        s += sgl.system("You write one line about a topic. " * 8)
        s += sgl.user("Topic: " + topic)
        s += sgl.assistant(sgl.gen("line", max_tokens=3, **NOISE))

    prefix = prog.prefix(runtime)
    prefix_tokens = len(runtime.tokenizer(prefix).input_ids)
    assert prefix_tokens > 64
    runtime.engine.flush_cache()
    states = prog.run_batch(
        [{"topic": t} for t in ["cats", "rain", "tea", "maps"]], backend=runtime
    )
    page = runtime.engine.stats()["page_size"]
    for state in states:
        assert state.error is None
        assert state.get_meta_info("line")["cached_tokens"] >= prefix_tokens - page


def test_select_scores_all_choices_in_one_call(runtime, monkeypatch):
    calls = []
    score = runtime.engine.score
    monkeypatch.setattr(
        runtime.engine, "score", lambda p, c, **kw: calls.append(list(c)) or score(p, c, **kw)
    )

    @sgl.function
    def prog(s):
        s += sgl.user("Is water wet?")
        s += sgl.assistant(sgl.select("v", ["True", "False", "Unknown"]))

    state = prog.run(backend=runtime)
    assert calls == [["True", "False", "Unknown"]]
    assert state["v"] in ("True", "False", "Unknown")
    assert state.messages()[-1] == {"role": "assistant", "content": state["v"]}
    assert len(state.get_meta_info("v")["token_logprobs"]) == 3


@pytest.mark.parametrize("method", ["greedy", "unconditional_likelihood_normalized"])
def test_other_select_methods_run_on_the_engine(runtime, method):
    @sgl.function
    def prog(s):
        s += sgl.assistant(sgl.select("v", ["yes", "no", "maybe so"], method=method))

    assert prog.run(backend=runtime)["v"] in ("yes", "no", "maybe so")


SHARED = "A shared context that every branch starts from. " * 6


def test_fork_join_on_the_engine(runtime):
    @sgl.function
    def prog(s):
        s += SHARED
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += "Branch " + str(i) + ":" + sgl.gen("idea", max_tokens=3, **NOISE)
        forks.join()

    runtime.engine.flush_cache()
    state = prog.run(backend=runtime)
    assert len(state["idea"]) == 3 and all(isinstance(x, str) for x in state["idea"])
    metas = state.get_meta_info("idea")
    shared = len(
        runtime.tokenizer("A shared context that every branch starts from. " * 6).input_ids
    )
    page = runtime.engine.stats()["page_size"]
    # fork put the shared prefix in the cache before any branch ran
    assert all(m["cached_tokens"] >= shared - page for m in metas)


def test_fork_and_gen_on_an_empty_state(runtime):
    @sgl.function
    def prog(s):
        forks = s.fork(2)
        for f in forks:
            f += sgl.gen("g", max_tokens=2, **NOISE)
        forks.join()

    assert len(prog.run(backend=runtime)["g"]) == 2


def test_a_failing_program_does_not_stop_the_batch(runtime):
    @sgl.function
    def prog(s, top_p):
        s += "Hello" + sgl.gen("g", max_tokens=2, top_p=top_p, **NOISE)

    states = prog.run_batch([{"top_p": 1.0}, {"top_p": 7.0}, {"top_p": 0.5}], backend=runtime)
    assert states[0].error is None and states[2].error is None
    assert isinstance(states[1].error, sgl.BackendError)
    assert "top_p" in str(states[1].error)
    assert states[1].text() == "Hello"


@pytest.mark.parametrize(
    ("options", "allowed"),
    [
        pytest.param({"choices": ["red", "green", "blue"]}, {"red", "green", "blue"}, id="choices"),
        pytest.param({"dtype": bool}, {"True", "False"}, id="dtype-bool"),
        pytest.param({"regex": "(yes|no|maybe)"}, {"yes", "no", "maybe"}, id="regex"),
    ],
)
def test_constrained_gen_on_a_random_model(runtime, options, allowed):
    @sgl.function
    def prog(s):
        s += "Pick: " + sgl.gen("v", max_tokens=8, temperature=0, **options)

    state = prog.run(backend=runtime)
    assert state["v"] in allowed and isinstance(state["v"], str)
