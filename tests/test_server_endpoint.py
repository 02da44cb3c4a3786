"""DSL programs through `RuntimeEndpoint` against a real server process (tiny random Llama)."""

from __future__ import annotations

import httpx
import pytest
from transformers import AutoTokenizer

import sgl_dsl as sgl
from sgl_dsl.backend.endpoint import RuntimeEndpoint
from tests._server_fixtures import shared_server, tiny_model_dir

NOISE = {"temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    return shared_server()


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
