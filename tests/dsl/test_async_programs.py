"""`run_async` / `run_batch_async` / `async for` / `await state.wait()`: one event loop drives
many programs without a thread each, with the same results as the blocking API.

The scripted backend answers from a table and, in its async form, holds every call open on the
loop for a moment, so the tests can see how many programs were in flight at once. The real
engine, a real server and the OpenAI backend then give the same answers as `run_batch`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import sgl_dsl as sgl
from sgl_dsl.backend.base import GenOutput
from tests.support.dsl_backends import FakeBackend


class AsyncFake(FakeBackend):
    """`FakeBackend` with native async calls that each stay in flight for `delay` seconds."""

    def __init__(self, *args: Any, delay: float = 0.01, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.delay = delay
        self.in_flight = 0
        self.peak_in_flight = 0

    async def _hold(self) -> None:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1

    async def agenerate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        await self._hold()
        return self.generate(prompt, params)

    async def ascore(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        await self._hold()
        return self.score(prompt, continuations)

    async def acommit_prefix(self, prefix: str) -> None:
        self.commit_prefix(prefix)


ANSWERS = {"Q: a\nA:": " one", "Q: b\nA:": " two", "n:": "42"}


@sgl.function
def qa(s, q):
    s += "Header.\n"
    s += "Q: " + q + "\nA:" + sgl.gen("ans", max_tokens=4)
    s += "\nok?" + sgl.select("ok", ["yes", "no"])
    s += "\nn:" + sgl.gen("n", type=int)


@sgl.function
def forked(s, q):
    s += "Q: " + q
    forks = s.fork(3)
    for f in forks:
        f += "\nn:" + sgl.gen("n", max_tokens=2)
    forks.join()
    s += "\nafter"


@sgl.function
def concatenated(s, q):
    s += "Q: " + q
    forks = s.fork(2)
    forks += lambda i: "\npart " + str(i) + ":" + sgl.gen("p", max_tokens=2)
    forks.join("concate_and_append")
    inner = s.fork(2)
    for f in inner:
        nested = f.fork(2)
        nested += "\nn:" + sgl.gen("deep", max_tokens=2)
        nested.join()
    inner.join()
    s += "\nend"


@sgl.function
def branching(s, q):
    s += "Q: " + q + "\nA:" + sgl.gen("ans")
    if s["ans"] == " one":  # a generated value as a Python value: no trace holds this
        s += "\nn:" + sgl.gen("n", type=int)


@sgl.function
def failing(s, q):
    s += "Q: " + q + "\nA:" + sgl.gen("ans", regex="[")  # invalid: raises when built


def fake() -> AsyncFake:
    return AsyncFake(answers=ANSWERS, scores={"yes": -1.0, "no": -3.0})


@pytest.mark.parametrize(
    "program, kwargs",
    [
        pytest.param(qa, {"q": "a"}, id="gen-select-typed"),
        pytest.param(forked, {"q": "b"}, id="fork-join"),
        pytest.param(concatenated, {"q": "a"}, id="concatenate-and-nested-forks"),
        pytest.param(branching, {"q": "a"}, id="branching-on-a-value"),
    ],
)
def test_run_async_gives_what_run_gives(program, kwargs):
    backend = fake()
    expected = program.run(backend=backend, **kwargs)
    got = asyncio.run(program.run_async(backend=backend, **kwargs))
    assert got.text() == expected.text()
    assert {k: got[k] for k in expected._vars} == {k: expected[k] for k in expected._vars}


def test_a_batch_runs_all_at_once_on_one_loop_without_threads():
    backend = fake()
    batch = [{"q": "a" if i % 2 else "b"} for i in range(200)]
    before = threading.active_count()

    async def main():
        states = await qa.run_batch_async(batch, backend=backend)
        return states, threading.active_count()

    states, after = asyncio.run(main())
    assert after <= before
    assert backend.peak_in_flight == len(batch)  # every program's gen in flight together
    assert [s["ans"] for s in states] == [" one" if i % 2 else " two" for i in range(200)]
    assert all(s["n"] == 42 and s.error is None for s in states)
    commits = [c for c in backend.calls if c[0] == "commit"]
    assert commits == [("commit", "Header.\nQ: ", None)]  # the shared prefix, prefilled once


def test_max_concurrency_bounds_the_programs_in_flight():
    backend = fake()
    states = asyncio.run(qa.run_batch_async([{"q": "a"}] * 20, backend=backend, max_concurrency=4))
    assert backend.peak_in_flight == 4
    assert all(s["ans"] == " one" for s in states)


def test_forks_decode_together_and_join_in_order():
    backend = fake()
    state = asyncio.run(forked.run_async(q="a", backend=backend))
    assert backend.peak_in_flight == 3
    assert state["n"] == ["42", "42", "42"]
    assert state.text() == "Q: a\nafter"


def test_a_failing_program_keeps_its_error_and_the_batch_runs_on():
    backend = fake()

    @sgl.function
    def maybe_failing(s, q, bad):
        s += "Q: " + q + "\nA:" + sgl.gen("ans", regex="[" if bad else None)

    async def main():
        return await maybe_failing.run_batch_async(
            [{"q": "a", "bad": False}, {"q": "a", "bad": True}, {"q": "b", "bad": False}],
            backend=backend,
        )

    states = asyncio.run(main())
    assert isinstance(states[1].error, sgl.ProgramError)
    assert [states[0]["ans"], states[2]["ans"]] == [" one", " two"]
    with pytest.raises(sgl.ProgramError, match="invalid regex"):
        asyncio.run(failing.run_async(q="a", backend=backend))


def test_async_for_streams_the_text_and_wait_returns_the_state():
    backend = fake()

    async def main():
        state = await qa.run_async(q="a", backend=backend, stream=True)
        pieces = [piece async for piece in state]
        return state, pieces, await state.wait()

    state, pieces, waited = asyncio.run(main())
    assert waited is state
    assert "".join(pieces) == state.text()
    assert len(pieces) > 4  # streamed in pieces, not the whole text at the end


def test_text_async_iter_of_one_variable():
    async def main():
        state = await qa.run_async(q="b", backend=fake(), stream=True)
        return [p async for p in state.text_async_iter("ans")]

    assert "".join(asyncio.run(main())) == " two"


def test_reading_a_running_state_on_its_loop_is_an_error_not_a_hang():
    async def main():
        state = await qa.run_async(q="a", backend=fake(), stream=True)
        with pytest.raises(sgl.ProgramError, match="await state.wait"):
            state["ans"]
        await state.wait()
        return state["ans"]

    assert asyncio.run(main()) == " one"


def test_a_backend_with_only_blocking_calls_runs_on_a_small_shared_pool():
    backend = FakeBackend(answers=ANSWERS, scores={"yes": -1.0})
    before = threading.active_count()

    async def main():
        states = await qa.run_batch_async([{"q": "a"}] * 50, backend=backend)
        return states, threading.active_count()

    states, during = asyncio.run(main())
    assert all(s["n"] == 42 for s in states)
    assert during - before <= sgl.backend.base.ASYNC_FALLBACK_THREADS


# ---- real backends: the same answers as the blocking API ------------------------------------

NOISE = {"temperature": 0, "ignore_eos": True}


@sgl.function
def noisy(s, q):
    s += sgl.system("You are terse.")
    s += sgl.user(q)
    s += sgl.assistant(sgl.gen("ans", max_tokens=5, **NOISE))
    s += sgl.user("Sure?")
    s += sgl.assistant(sgl.select("sure", ["yes", "no"]))


QUESTIONS = [{"q": f"Question {i}?"} for i in range(12)]


def _same_as_run_batch(backend) -> None:
    expected = noisy.run_batch(QUESTIONS, backend=backend)
    before = threading.active_count()

    async def main():
        states = await noisy.run_batch_async(QUESTIONS, backend=backend)
        return states, threading.active_count()

    states, during = asyncio.run(main())
    assert during <= before
    assert [s.text() for s in states] == [s.text() for s in expected]
    assert [s["sure"] for s in states] == [s["sure"] for s in expected]


def test_in_process_engine_async_batch_equals_run_batch(runtime):
    _same_as_run_batch(runtime)


def test_server_endpoint_async_batch_equals_run_batch(server):
    backend = sgl.RuntimeEndpoint(server.url)
    try:
        _same_as_run_batch(backend)
    finally:
        backend.shutdown()


def test_openai_backend_async_equals_blocking(server):
    model = sgl.RuntimeEndpoint(server.url).model_info["served_model_name"]
    backend = sgl.OpenAI(model, base_url=server.url + "/v1", api_key="unused")

    @sgl.function
    def chat(s, q):
        s += sgl.user(q)
        s += sgl.assistant(sgl.gen("ans", max_tokens=5, temperature=0))

    try:
        expected = [s["ans"] for s in chat.run_batch(QUESTIONS[:4], backend=backend)]
        states = asyncio.run(chat.run_batch_async(QUESTIONS[:4], backend=backend))
        assert [s["ans"] for s in states] == expected
    finally:
        backend.shutdown()


def test_streaming_from_the_engine_on_the_loop(runtime):
    expected = noisy.run(q="Hi?", backend=runtime)

    async def main():
        state = await noisy.run_async(q="Hi?", backend=runtime, stream=True)
        pieces = [p async for p in state.text_async_iter("ans")]
        await state.wait()
        return pieces

    pieces = asyncio.run(main())
    assert "".join(pieces) == expected["ans"]


@sgl.function
def sglang_options(s):
    s += "Once upon a time" + sgl.gen(
        "x",
        max_tokens=3,
        temperature=0,
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
    )
    s += "\nCount:" + sgl.gen("many", 4, None, 3, temperature=0)
    s += "\nMore:" + sgl.gen("cut", max_tokens=24, stop_regex=r"[aeiou]", temperature=0)


@pytest.mark.parametrize("kind", ["runtime", "endpoint"])
def test_logprobs_n_and_stop_regex_are_the_same_awaited(kind, runtime, server):
    backend = runtime if kind == "runtime" else sgl.RuntimeEndpoint(server.url)
    expected = sglang_options.run(backend=backend)
    got = asyncio.run(sglang_options.run_async(backend=backend))
    assert got.text() == expected.text()
    assert got["many"] == expected["many"] and got["cut"] == expected["cut"]
    a, b = got.get_meta_info("x"), expected.get_meta_info("x")
    assert [t[1:] for t in a["output_token_logprobs"]] == [
        t[1:] for t in b["output_token_logprobs"]
    ]
    assert [t[1:] for t in a["input_token_logprobs"]] == [t[1:] for t in b["input_token_logprobs"]]
    assert a["input_token_logprobs"][0][0] is None
    assert [t[0] for t in a["input_token_logprobs"][1:]] == pytest.approx(
        [t[0] for t in b["input_token_logprobs"][1:]], abs=1e-4
    )
    assert (
        got.get_meta_info("cut")["finish_reason"] == expected.get_meta_info("cut")["finish_reason"]
    )


@pytest.mark.parametrize(
    "program, traced",
    [
        pytest.param(qa, True, id="straight-line"),
        pytest.param(concatenated, True, id="forks"),
        pytest.param(branching, False, id="branches-on-a-value"),
    ],
)
def test_which_programs_run_traced_on_the_loop(program, traced):
    assert (program._trace_bound((), {"q": "a"}) is not None) is traced
