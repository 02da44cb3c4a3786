"""`Engine.async_generate` / `async_score`: awaited on one event loop, no thread per request,
the same answers as the blocking calls, and an abandoned request frees its pages."""

from __future__ import annotations

import asyncio
import threading

import pytest

from runtime import Engine
from tests.support.tiny_models import PROMPTS, make_tiny_model

N = 6


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-llama-async"), seed=5)
    with Engine(folder, page_size=4, max_total_tokens=2048) as eng:
        yield eng


def test_many_awaits_get_the_blocking_answers_without_new_threads(engine):
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} #{i}" for i in range(32)]
    expected = [
        engine.generate(p, max_new_tokens=N, temperature=0.0, ignore_eos=True).token_ids
        for p in prompts
    ]
    before = threading.active_count()

    async def main():
        calls = [
            engine.async_generate(p, max_new_tokens=N, temperature=0.0, ignore_eos=True)
            for p in prompts
        ]
        results = await asyncio.gather(*calls)
        return results, threading.active_count()

    results, during = asyncio.run(main())
    assert [r.token_ids for r in results] == expected
    assert during <= before  # no thread per request (nor any new thread)
    engine.check_integrity()


def test_async_stream_yields_the_same_text_and_ends_finished(engine):
    prompt = PROMPTS[0]
    whole = engine.generate(prompt, max_new_tokens=N, temperature=0.0, ignore_eos=True)

    async def main():
        chunks = await engine.async_generate(
            prompt, stream=True, max_new_tokens=N, temperature=0.0, ignore_eos=True
        )
        return [chunk async for chunk in chunks]

    chunks = asyncio.run(main())
    assert chunks[-1].finished and chunks[-1].result.token_ids == whole.token_ids
    assert "".join(c.text_delta for c in chunks) == whole.text


def test_closing_an_async_stream_early_aborts_and_frees_its_pages(engine):
    engine.flush_cache()
    free_before = engine.pool.num_free_pages

    async def main():
        chunks = await engine.async_generate(
            PROMPTS[1], stream=True, max_new_tokens=200, temperature=0.0, ignore_eos=True
        )
        first = await chunks.__anext__()
        await chunks.aclose()
        return first

    assert not asyncio.run(main()).finished
    engine.generate(PROMPTS[2], max_new_tokens=1)  # a step after the abort reaps it
    engine.flush_cache()
    assert engine.pool.num_free_pages == free_before
    engine.check_integrity()


def test_async_score_equals_score(engine):
    continuations = [" yes", " no", " maybe later"]
    expected = engine.score(PROMPTS[0], continuations, return_token_logprobs=True)
    got = asyncio.run(engine.async_score(PROMPTS[0], continuations, return_token_logprobs=True))
    assert [len(g) for g in got] == [len(e) for e in expected]
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=1e-5)


def test_an_invalid_async_request_raises_naming_the_problem(engine):
    with pytest.raises(ValueError, match="token ids"):
        asyncio.run(engine.async_generate([10**9], max_new_tokens=1))
