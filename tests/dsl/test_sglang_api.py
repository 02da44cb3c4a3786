"""SGLang's frontend API in sgl_dsl: names, signatures and semantics, on the scripted fake
backend (what each call sends, what the state holds)."""

from __future__ import annotations

import inspect

import pytest

import sgl_dsl as sgl
from sgl_dsl.ir import Gen, Select
from tests.support.dsl_backends import FakeBackend

SGLANG_NAMES = (
    "Runtime RuntimeEndpoint assistant assistant_begin assistant_end flush_cache function gen "
    "gen_int gen_string get_server_info global_config greedy_token_selection image select "
    "set_default_backend system system_begin system_end token_length_normalized "
    "unconditional_likelihood_normalized user user_begin user_end video"
).split()


@pytest.fixture
def fake():
    backend = FakeBackend(answers={"Q:": "abc123def", "A:": "yes"}, scores={"yes": -1.0})
    sgl.set_default_backend(backend)
    yield backend
    sgl.set_default_backend(None)


def test_sglang_names_exist():
    missing = [n for n in SGLANG_NAMES if not hasattr(sgl, n)]
    assert not missing


def test_gen_takes_sglang_positional_order():
    sglang_order = (
        "name max_tokens min_tokens n stop stop_token_ids stop_regex temperature top_p top_k "
        "min_p frequency_penalty presence_penalty ignore_eos return_logprob logprob_start_len "
        "top_logprobs_num return_text_in_logprobs dtype choices choices_method regex json_schema"
    ).split()
    assert list(inspect.signature(sgl.gen).parameters)[: len(sglang_order)] == sglang_order
    g = sgl.gen("x", 5, 1, 2, "\n", [7], r"\d")
    assert isinstance(g, Gen)
    assert g.params == {
        "max_tokens": 5,
        "min_tokens": 1,
        "n": 2,
        "stop": ["\n"],
        "stop_token_ids": [7],
        "stop_regex": [r"\d"],
    }
    assert sgl.gen_int("i", 4).params == {"max_tokens": 4, "dtype": "int"}
    assert sgl.gen_string("s", 4, 1, "\n").params == {
        "max_tokens": 4,
        "stop": ["\n"],
        "dtype": "str",
    }


def test_gen_choices_is_select_unless_sampled():
    chosen = sgl.gen("c", choices=["a", "b"], choices_method=sgl.greedy_token_selection)
    assert isinstance(chosen, Select) and chosen.method is sgl.greedy_token_selection
    assert isinstance(sgl.gen("c", choices=["a", "b"]), Select)
    sampled = sgl.gen("c", choices=["a", "b"], temperature=0.7)
    assert isinstance(sampled, Gen) and sampled.params["choices"] == ["a", "b"]


def test_bad_input_is_a_typed_error():
    with pytest.raises(sgl.ProgramError, match="invalid regex"):
        sgl.gen("x", regex="(")
    with pytest.raises(sgl.ProgramError, match="n must be"):
        sgl.gen("x", n=0)
    with pytest.raises(sgl.ProgramError, match="temperature"):
        sgl.select("x", ["a", "b"], 0.5)
    with pytest.raises(sgl.ProgramError, match="text-only"):
        sgl.image("cat.png")
    with pytest.raises(sgl.ProgramError, match="text-only"):
        sgl.video("cat.mp4", 4)
    with pytest.raises(sgl.ProgramError, match="join mode"):
        FakeForks().join(mode="zip")


class FakeForks:
    def join(self, mode):
        from sgl_dsl.fork_group import check_join_mode

        check_join_mode(mode)


def test_select_signature_and_methods(fake):
    @sgl.function
    def prog(s):
        s += "A:" + sgl.select("v", ["yes", "no"], 0.0, sgl.token_length_normalized)
        s += sgl.select("w", choices=["yes", "no"], choices_method="greedy_token_selection")

    state = prog.run()
    assert state["v"] == "yes" and state["w"] == "yes"
    meta = state.get_meta_info("v")
    assert meta["normalized_prompt_logprobs"] == [-1.0, -5.0]


def test_function_decorator_call_bind_and_spec_tokens(fake):
    @sgl.function(num_api_spec_tokens=64)
    def prog(s, q, tag):
        s += tag + " Q:" + sgl.gen("a", max_tokens=4) + " " + q

    assert prog.num_api_spec_tokens == 64
    state = prog(q="why", tag="[1]")  # calling outside a program runs it
    state.sync()
    assert state["a"] == "abc123def" and state.text().endswith(" why")
    bound = prog.bind(tag="[2]")
    assert bound.run(q="how").text().startswith("[2]")
    with pytest.raises(sgl.ProgramError, match="no argument"):
        prog.bind(nope=1)


def test_run_keywords_are_gen_defaults(fake):
    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("a")
        s += "Q:" + sgl.gen("b", max_tokens=3, stop=".")

    prog.run(max_new_tokens=9, stop=["\n"], top_k=5, ignore_eos=True, logprob_start_len=2)
    first, second = [c[2] for c in fake.calls if c[0] == "generate"]
    assert first == {
        "max_tokens": 9,
        "stop": ["\n"],
        "top_k": 5,
        "ignore_eos": True,
        "logprob_start_len": 2,
    }
    assert second["max_tokens"] == 3 and second["stop"] == ["."]


def test_run_batch_positional_and_generator_style(fake):
    @sgl.function
    def prog(s, q):
        s += q + " Q:" + sgl.gen("a")

    states = prog.run_batch([["one"], ("two",)], temperature=0)
    assert [s.text().split()[0] for s in states] == ["one", "two"]
    gen = prog.run_batch([{"q": "x"}, {"q": "y"}, {"q": "z"}], generator_style=True)
    assert inspect.isgenerator(gen)
    assert [s.text()[0] for s in gen] == ["x", "y", "z"]
    with pytest.raises(sgl.ProgramError, match="positional"):
        prog.run_batch([["a", "b"]])


def test_forks_append_and_join_modes(fake):
    @sgl.function
    def prog(s):
        s += "Head.\n"
        forks = s.fork(3)
        forks += lambda i: "S" + str(i) + "\n"
        forks += "Q:"
        forks += [sgl.gen("a"), "", ""]
        forks.join(mode="concate_and_append")
        s += "End."

    state = prog.run()
    assert state.text() == "Head.\nS0\nQ:abc123defS1\nQ:S2\nQ:End."
    assert "a" not in state

    @sgl.function
    def gather(s):
        forks = s.fork(2)
        for f in forks:
            f += "Q:" + sgl.gen("a")
        forks.join()

    assert gather.run()["a"] == ["abc123def", "abc123def"]
    assert "join %fork0 into %0 mode=concate_and_append" in str(prog.trace())


def test_n_stop_regex_and_meta_info(fake):
    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("many", n=2)
        s += " Q:" + sgl.gen("cut", stop_regex=[r"\d+", "zzz"])

    state = prog.run()
    assert state["many"] == ["abc123def", "abc123def"]
    assert state["cut"] == "abc" and state.text() == "Q:abc123def Q:abc"
    meta = state.get_meta_info("cut")
    # the text is watched as it streams (one character per chunk here): "1" matches first
    assert meta["finish_reason"] == {"type": "stop", "matched": "1"}
    assert meta["finish_reason"] == "stop"  # the older string comparison still holds
    assert [m["finish_reason"]["type"] for m in state.get_meta_info("many")] == ["stop"] * 2


def test_text_iter_var_name_and_messages(fake):
    @sgl.function
    def prog(s):
        s += sgl.user("Q:")
        s += sgl.assistant(sgl.gen("a"))

    state = prog.run(stream=True)
    assert "".join(state.text_iter(var_name="a")) == "x"  # the fake's answer after a role
    state.sync()
    assert [m["role"] for m in state.messages()][-2:] == ["user", "assistant"]
    with prog.run().copy() as child:
        child += "more"


def test_global_config_and_server_helpers(fake):
    assert sgl.global_config.default_backend is fake
    other = FakeBackend()
    sgl.global_config.default_backend = other
    assert sgl.get_default_backend() is other
    assert sgl.flush_cache() is False and sgl.get_server_info() == {}
    sgl.set_default_backend(None)
    assert sgl.flush_cache() is False and sgl.get_server_info() is None


def test_text_async_iter(fake):
    import asyncio

    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("a")

    async def collect(state):
        return [piece async for piece in state.text_async_iter("a", return_meta_data=True)]

    pairs = asyncio.run(collect(prog.run(stream=True)))
    assert "".join(p for p, _ in pairs) == "abc123def"
    assert pairs[-1][1] is None or pairs[-1][1]["finish_reason"] == "stop"
