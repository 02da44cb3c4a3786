"""DSL programs through `RuntimeEndpoint` against a real server process (tiny random Llama)."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

import sgl_dsl as sgl
from sgl_dsl.backend.endpoint import RuntimeEndpoint
from tests.support.server_process import tiny_model_dir

NOISE = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def endpoint(server):
    backend = RuntimeEndpoint(server.url)
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny_model_dir()))


def _requests(server, path: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(f'sgl_requests_total{{endpoint="{path}",status="200"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@sgl.function
def two_turns(s, question):
    s += sgl.system("You are terse.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=6, **NOISE))
    with s.user():
        s += "And why?"
    with s.assistant():
        s += sgl.gen("why", max_tokens=4, **NOISE)


def test_chat_template_matches_the_in_process_one(endpoint, tokenizer):
    from sgl_dsl.chat_template import ChatTemplate

    assert endpoint.chat_template() == ChatTemplate.from_tokenizer(tokenizer)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}],
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
        ],
    ],
)
def test_local_template_render_matches_the_server(endpoint, messages):
    # used when a gateway in front of the server does not route /apply_chat_template
    assert endpoint._render_locally(messages) == endpoint._render(messages)


def test_program_text_is_the_tokenizers_template_render(endpoint, tokenizer):
    state = two_turns.run(question="Capital of France?", backend=endpoint)
    messages = state.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert state.text() == tokenizer.apply_chat_template(messages, tokenize=False)
    assert state.get_meta_info("answer")["completion_tokens"] == 6
    # the second turn's prompt starts with the first turn, which the radix cache kept
    first = state.get_meta_info("answer")["prompt_tokens"]
    assert state.get_meta_info("why")["cached_tokens"] >= first - 16


def test_streamed_pieces_make_up_the_variable(endpoint):
    @sgl.function
    def prog(s):
        s += "Once upon a time" + sgl.gen("story", max_tokens=8, **NOISE)

    state = prog.run(backend=endpoint, stream=True)
    pieces = list(state.text_iter("story"))
    assert len(pieces) > 1 and "".join(pieces) == state["story"]


def test_select_is_one_score_request(server, endpoint):
    @sgl.function
    def prog(s):
        s += sgl.user("Is water wet?")
        s += sgl.assistant(sgl.select("v", ["True", "False", "Unknown"]))

    before = _requests(server, "/score")
    state = prog.run(backend=endpoint)
    assert _requests(server, "/score") == before + 1
    assert state["v"] in ("True", "False", "Unknown")
    assert len(state.get_meta_info("v")["token_logprobs"]) == 3


@pytest.mark.parametrize(
    "prompt, continuations",
    [
        ("The sky is", [" blue", " green", " the colour of the sea"]),
        ("<|im_start|>user\nIs water wet?<|im_end|>\n<|im_start|>assistant\n", ["True", "No"]),
    ],
)
def test_score_through_completions_matches_score(server, endpoint, prompt, continuations):
    # the fallback used behind a gateway (no /score there) gives /score's numbers, in one call
    direct = endpoint.score(prompt, continuations)
    before = _requests(server, "/v1/completions")
    routed = endpoint._score_by_completions(prompt, continuations)
    assert _requests(server, "/v1/completions") == before + 1
    assert [len(r) for r in routed] == [len(d) for d in direct]
    for r, d in zip(routed, direct, strict=True):
        assert r == pytest.approx(d, rel=1e-6, abs=1e-6)  # equal in practice


def test_completions_echo_logprobs_cover_the_prompt(server, tokenizer):
    body = {"prompt": "Hello there", "echo": True, "logprobs": 0, "max_tokens": 2, "n": 2}
    body.update(NOISE)
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    n_prompt = len(tokenizer("Hello there").input_ids)
    for choice in reply["choices"]:
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == n_prompt + 2
        assert lp["token_logprobs"][0] is None
        assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
        assert "".join(lp["tokens"]) == choice["text"]
        assert lp["text_offset"][n_prompt] == len("Hello there")


def test_choices_and_dtype_are_sent_as_regex(endpoint):
    body = endpoint._body("x", {"choices": [" a.b", "(c)"], "seed": 5}, False)
    assert body["sampling_params"] == {"regex": r"( a\.b|\(c\))", "seed": 5, "sampling_seed": 5}
    body = endpoint._body("x", {"dtype": "int"}, False)
    assert "dtype" not in body["sampling_params"] and body["sampling_params"]["regex"]


def test_sampling_seed_is_seed(server):
    def sample(params: dict) -> str:
        body = {"text": "Once", "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
        body["sampling_params"].update(params)
        reply = httpx.post(f"{server.url}/generate", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()["text"]

    assert sample({"sampling_seed": 9}) == sample({"seed": 9}) == sample({"seed": 9})
    reply = httpx.post(
        f"{server.url}/generate",
        json={"text": "Once", "sampling_params": {"seed": 1, "sampling_seed": 2}},
        timeout=60,
    )
    assert reply.status_code == 400


def test_gen_choices_honoured_against_one_server(endpoint):
    @sgl.function
    def prog(s):
        s += "The sky is" + sgl.gen("c", choices=[" blue", " green"], temperature=1.0, seed=3)

    for _ in range(3):
        assert prog.run(backend=endpoint)["c"] in (" blue", " green")


def test_fork_commits_the_shared_prefix_before_the_branches(server, endpoint, tokenizer):
    shared = "A context only this fork test uses, long enough for pages. " * 5

    @sgl.function
    def prog(s):
        s += shared
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += "Branch " + str(i) + ":" + sgl.gen("idea", max_tokens=3, **NOISE)
        forks.join()

    state = prog.run(backend=endpoint)
    n_shared = len(tokenizer(shared).input_ids)
    assert all(m["cached_tokens"] >= n_shared - 16 for m in state.get_meta_info("idea"))


def test_batch_with_a_bad_request_keeps_the_others(endpoint):
    @sgl.function
    def prog(s, top_p):
        s += "Hello" + sgl.gen("g", max_tokens=2, top_p=top_p, **NOISE)

    states = prog.run_batch([{"top_p": 1.0}, {"top_p": 7.0}, {"top_p": 0.5}], backend=endpoint)
    assert states[0].error is None and states[2].error is None
    assert isinstance(states[1].error, sgl.BackendError) and "top_p" in str(states[1].error)


def test_unreachable_server_is_a_backend_error():
    with pytest.raises(sgl.BackendError, match="get_model_info"):
        RuntimeEndpoint("http://127.0.0.1:9", timeout=2)
