"""Many threads calling one engine: every request is answered exactly once, correctly."""

from __future__ import annotations

import threading

import pytest

from runtime import Engine
from tests.support.tiny_models import PROMPTS, hf_greedy, hf_model, make_tiny_model

N = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama-threads"), seed=3)


@pytest.mark.parametrize("pool_tokens", [4096, 128], ids=["roomy-pool", "tiny-pool"])
def test_many_threads_each_get_their_own_answer(model_dir, pool_tokens):
    hf = hf_model(model_dir)
    with Engine(model_dir, page_size=4, max_total_tokens=pool_tokens,
                chunked_prefill_tokens=32) as engine:  # fmt: skip
        tok = engine.tokenizer
        prompts = [f"{PROMPTS[i % len(PROMPTS)]} #{i}" for i in range(24)]
        expected = {p: hf_greedy(hf, tok(p).input_ids, N) for p in prompts}
        results: dict[int, list] = {i: [] for i in range(len(prompts))}
        errors: list[BaseException] = []

        def worker(indices: list[int]) -> None:
            try:
                for i in indices:
                    r = engine.generate(prompts[i], max_new_tokens=N, temperature=0.0,
                                        ignore_eos=True)  # fmt: skip
                    results[i].append(r)
                    engine.stats()
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(list(range(t, 24, 8)),)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors
        assert all(len(v) == 1 for v in results.values())
        for i, p in enumerate(prompts):
            assert results[i][0].token_ids == expected[p]
            assert results[i][0].prompt_token_ids == tok(p).input_ids
        engine.check_integrity()
