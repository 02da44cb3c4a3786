"""Engine end to end on a tiny random Llama: greedy equals transformers' generate() token for
token (cache on and off, alone, batched, under eviction and preemption), sampling options,
score, streaming, errors."""

from __future__ import annotations

import pytest
import torch

from runtime import Engine, GenerateResult, StreamChunk
from runtime.errors import PromptTooLongError
from tests.support.tiny_models import PROMPTS, hf_greedy, hf_model

N = 12


@pytest.fixture(scope="module")
def hf(model_dir):
    return hf_model(model_dir)


@pytest.fixture(scope="module")
def expected(hf, model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return {p: hf_greedy(hf, tok(p).input_ids, N) for p in PROMPTS}


@pytest.fixture(scope="module")
def engine(model_dir):
    with Engine(model_dir, page_size=4, max_total_tokens=4096) as e:
        yield e


@pytest.fixture(scope="module")
def engine_nocache(model_dir):
    with Engine(model_dir, page_size=4, max_total_tokens=4096, enable_radix_cache=False) as e:
        yield e


GREEDY = dict(max_new_tokens=N, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("cache", [True, False], ids=["cache-on", "cache-off"])
def test_greedy_alone_matches_transformers(engine, engine_nocache, expected, cache):
    e = engine if cache else engine_nocache
    for prompt in PROMPTS:
        r = e.generate(prompt, **GREEDY)
        assert r.token_ids == expected[prompt], prompt
        assert r.finish_reason == "length"
        assert r.usage.completion_tokens == N
        assert r.usage.decode_steps == N - 1
    e.check_integrity()


@pytest.mark.parametrize("cache", [True, False], ids=["cache-on", "cache-off"])
def test_greedy_batch_matches_transformers(engine, engine_nocache, expected, cache):
    e = engine if cache else engine_nocache
    batch = PROMPTS * 2
    results = e.generate(batch, **GREEDY)
    assert [r.token_ids for r in results] == [expected[p] for p in batch]
    e.check_integrity()


def test_tiny_pool_evicts_and_preempts_without_changing_outputs(model_dir, expected):
    with Engine(model_dir, page_size=4, max_total_tokens=96, chunked_prefill_tokens=16) as e:
        results = e.generate(PROMPTS * 2, **GREEDY)
        assert [r.token_ids for r in results] == [expected[p] for p in PROMPTS * 2]
        stats = e.stats()
        assert stats["preemptions"] > 0
        assert stats["evicted_tokens"] > 0
        e.check_integrity()


def test_shared_prefix_in_one_call_is_computed_once(engine):
    engine.flush_cache()
    prefix = " ".join(f"word{i}" for i in range(60))
    prompts = [prefix + f" question {i}?" for i in range(6)]
    before = engine.stats()
    results = engine.generate(prompts, max_new_tokens=2, temperature=0.0)
    after = engine.stats()
    computed = after["prefill_computed_tokens"] - before["prefill_computed_tokens"]
    prefix_len = len(engine.tokenizer(prefix).input_ids)
    total = sum(r.usage.prompt_tokens for r in results)
    # the prefix is computed once; everyone else computes only its own tail (< 2 pages + tail)
    assert computed < total - 4 * prefix_len
    assert sum(r.usage.cached_tokens > 0 for r in results) >= 5


def test_prefill_only_request_warms_the_cache(engine):
    engine.flush_cache()
    prompt = "A warm prefix that will be reused by the next request, " * 3
    r0 = engine.generate(prompt, max_new_tokens=0)
    assert r0.token_ids == [] and r0.finish_reason == "length"
    r1 = engine.generate(prompt + "and more", max_new_tokens=1, temperature=0.0)
    assert r1.usage.cached_tokens >= (r0.usage.prompt_tokens // 4 - 1) * 4


def test_flush_cache_empties_the_tree(engine):
    engine.generate("something to cache " * 4, max_new_tokens=1)
    assert engine.stats()["cached_tokens"] > 0
    assert engine.flush_cache() is True
    assert engine.stats()["cached_tokens"] == 0


def test_stop_string_trims_text(engine):
    base = engine.generate(PROMPTS[1], **GREEDY)
    stop = base.text[len(base.text) // 2 : len(base.text) // 2 + 3]
    assert stop
    r = engine.generate(PROMPTS[1], stop=[stop], **GREEDY)
    assert r.finish_reason == "stop" and r.matched_stop == stop
    assert base.text.startswith(r.text) and stop not in r.text
    assert len(r.text) <= base.text.index(stop)


def test_stop_token_id_ends_generation(engine, expected):
    stop_id = expected[PROMPTS[0]][4]
    r = engine.generate(PROMPTS[0], stop_token_ids=[stop_id], **GREEDY)
    first = expected[PROMPTS[0]].index(stop_id)
    assert r.token_ids == expected[PROMPTS[0]][: first + 1]
    assert (r.finish_reason, r.matched_stop) == ("stop", stop_id)


def test_logprobs_match_transformers(engine, hf, expected):
    prompt = PROMPTS[2]
    r = engine.generate(prompt, logprobs=True, top_logprobs=3, **GREEDY)
    ids = engine.tokenizer(prompt).input_ids + r.token_ids
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0]
    ref = torch.log_softmax(logits, -1)
    n = len(engine.tokenizer(prompt).input_ids)
    want = [ref[n - 1 + i, t].item() for i, t in enumerate(r.token_ids)]
    assert r.logprobs == pytest.approx(want, abs=1e-4)
    for lp, top, tok in zip(r.logprobs, r.top_logprobs, r.token_ids, strict=True):
        assert len(top) == 3 and max(top, key=top.get) == tok
        assert top[tok] == pytest.approx(lp)


def test_repetition_penalty_matches_transformers(engine, hf):
    prompt_ids = engine.tokenizer(PROMPTS[4]).input_ids
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt_ids]), max_new_tokens=N, do_sample=False, repetition_penalty=1.5
        )
    r = engine.generate(PROMPTS[4], repetition_penalty=1.5, **GREEDY)
    assert r.token_ids == out[0, len(prompt_ids) :].tolist()


def test_top_k_one_is_greedy(engine, expected):
    r = engine.generate(PROMPTS[3], max_new_tokens=N, temperature=0.8, top_k=1, ignore_eos=True)
    assert r.token_ids == expected[PROMPTS[3]]


def test_seed_makes_sampling_reproducible(engine):
    kw = dict(max_new_tokens=N, temperature=1.0, top_p=0.9, min_p=0.01, ignore_eos=True)
    a = engine.generate(PROMPTS[0], seed=7, **kw)
    b = engine.generate([PROMPTS[0], PROMPTS[1]], seed=7, **kw)[0]
    outs = {tuple(engine.generate(PROMPTS[0], seed=s, **kw).token_ids) for s in range(4)}
    assert a.token_ids == b.token_ids
    assert len(outs) > 1


def test_min_new_tokens_blocks_eos(engine):
    eos = engine.eos_token_ids[0]
    r = engine.generate(PROMPTS[0], max_new_tokens=6, min_new_tokens=6, stop_token_ids=[eos])
    assert len(r.token_ids) == 6 and eos not in r.token_ids[:5]


def test_score_matches_transformers(engine, hf):
    prompt, conts = "The colour of the sky is", [" blue", " green and red", " 42"]
    scores = engine.score(prompt, conts)
    per_token = engine.score(prompt, conts, return_token_logprobs=True)
    p_ids = engine.tokenizer(prompt).input_ids
    for cont, total, toks in zip(conts, scores, per_token, strict=True):
        c_ids = engine.tokenizer(cont, add_special_tokens=False).input_ids
        with torch.no_grad():
            logits = hf(torch.tensor([p_ids + c_ids])).logits[0]
        lp = torch.log_softmax(logits, -1)
        want = [lp[len(p_ids) - 1 + i, t].item() for i, t in enumerate(c_ids)]
        assert toks == pytest.approx(want, abs=1e-4)
        assert total == pytest.approx(sum(want), abs=1e-3)


def test_stream_chunks_add_up_to_the_result(engine, expected):
    chunks = list(engine.generate(PROMPTS[1], stream=True, **GREEDY))
    assert all(isinstance(c, StreamChunk) for c in chunks)
    assert chunks[-1].finished and not any(c.finished for c in chunks[:-1])
    final: GenerateResult = chunks[-1].result
    assert "".join(c.text_delta for c in chunks) == final.text
    assert [t for c in chunks for t in c.token_ids] == final.token_ids == expected[PROMPTS[1]]


def test_closing_a_stream_aborts_the_request(engine):
    it = engine.generate(PROMPTS[0], stream=True, max_new_tokens=500, ignore_eos=True)
    next(it)
    it.close()
    stats = engine.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
    engine.check_integrity()


def test_prompt_longer_than_the_pool_is_refused(model_dir):
    with Engine(model_dir, page_size=4, max_total_tokens=64) as e:
        long_prompt = "word " * 200
        with pytest.raises(PromptTooLongError):
            e.generate(long_prompt, max_new_tokens=4)
        results = e.generate([PROMPTS[0], long_prompt, PROMPTS[4]], **GREEDY)
        assert [r.finish_reason for r in results] == ["length", "abort", "length"]
        assert "KV pool" in results[1].error
        e.check_integrity()


def test_token_id_prompts_and_text_prompts_agree(engine):
    ids = engine.tokenizer(PROMPTS[5]).input_ids
    a = engine.generate(ids, **GREEDY)
    b = engine.generate(PROMPTS[5], **GREEDY)
    assert a.token_ids == b.token_ids and a.prompt_token_ids == ids


def test_stats_report_pool_figures(engine):
    s = engine.stats()
    cfg = engine.config
    assert s["kv_bytes_per_token"] == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    assert s["kv_capacity_tokens"] >= 4096
    for key in ("cache_hit_tokens", "pool_usage", "evicted_tokens", "throughput_tok_s"):
        assert key in s


def test_same_prefix_arriving_during_prefill_is_computed_once(model_dir):
    import threading

    with Engine(model_dir, page_size=4, max_total_tokens=4096, chunked_prefill_tokens=32) as e:
        prefix = " ".join(f"token{i}" for i in range(120))
        prefix_len = len(e.tokenizer(prefix).input_ids)
        results = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(
                e.generate(prefix + f" tail {i}", max_new_tokens=2, temperature=0.0)))
            for i in range(4)
        ]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        computed = e.stats()["prefill_computed_tokens"]
        # whether the others arrive mid-prefill (they wait for it) or after (cache hits),
        # the long prefix is computed once, plus a page and a tail per request
        assert computed < prefix_len + 4 * 16
        assert len(results) == 4


def test_stats_split_step_time_between_the_model_and_the_scheduler(engine):
    before = engine.stats()
    engine.generate(PROMPTS[:2], max_new_tokens=4, temperature=0.0)
    after = engine.stats()
    assert after["forward_s"] > before["forward_s"]
    assert after["busy_s"] >= after["forward_s"]
    assert 0.0 <= after["scheduler_share"] < 1.0
