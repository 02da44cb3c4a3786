"""Speculative decoding in the engine: greedy output identical token for token to the same
engine without speculation (n-gram drafts, perfect drafts, wrong drafts), with logprobs, stop
strings, max_tokens, streaming, batches and sampling; rejected positions never reach the radix
cache; the numbers in stats() and usage."""

from __future__ import annotations

import json

import pytest

from runtime import Engine
from tests.runtime.speculative.conftest import OracleProposer
from tests.runtime.speculative.test_constrained_speculation import PROMPT, SCHEMA

REPEAT = "alpha beta gamma delta epsilon zeta eta theta. " * 5
PROMPTS = [REPEAT, "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3", "Hello there, how are"]


def _ref(engine, prompt, **kw):
    out = engine.generate(prompt, temperature=0.0, **kw)
    return out, out.prompt_token_ids + out.token_ids


def test_off_by_default(model_dir):
    with Engine(str(model_dir), max_total_tokens=512) as engine:
        assert engine.scheduler.speculation is None
        assert engine.stats()["speculative_algorithm"] is None


@pytest.mark.parametrize("prompt", PROMPTS)
def test_ngram_greedy_output_is_identical(engines, prompt):
    base, spec = engines
    a = base.generate(prompt, max_new_tokens=48, temperature=0.0)
    b = spec.generate(prompt, max_new_tokens=48, temperature=0.0)
    assert b.token_ids == a.token_ids
    assert b.text == a.text and b.finish_reason == a.finish_reason
    spec.check_integrity()


@pytest.mark.parametrize("wrong_every", [0, 3, 1])
def test_perfect_and_wrong_drafts_give_the_same_tokens(engines, oracle, wrong_every):
    base, spec = engines
    a, ref = _ref(base, REPEAT, max_new_tokens=40, logprobs=True, ignore_eos=True)
    proposer = oracle([ref], wrong_every)
    before = spec.stats()
    b = spec.generate(REPEAT, max_new_tokens=40, temperature=0.0, logprobs=True, ignore_eos=True)
    after = spec.stats()
    assert proposer.calls > 0
    assert b.token_ids == a.token_ids
    assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    steps = after["spec_verify_steps"] - before["spec_verify_steps"]
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    assert b.usage.spec_verify_ct > 0 and steps >= b.usage.spec_verify_ct
    if wrong_every == 0:  # every draft holds: several tokens per forward
        assert b.usage.spec_accept_length > 3
        assert b.usage.decode_steps < len(b.token_ids) / 3
    if wrong_every == 1:  # no draft holds: one token per forward, like decoding
        assert accepted == 0
    spec.check_integrity()


def test_rejected_positions_never_reach_the_radix_cache(engines, oracle):
    base, spec = engines
    a, ref = _ref(base, REPEAT, max_new_tokens=40, ignore_eos=True)
    oracle([ref], wrong_every=2)
    spec.flush_cache()
    b = spec.generate(REPEAT, max_new_tokens=40, temperature=0.0, ignore_eos=True)
    assert b.token_ids == a.token_ids

    def cached_tokens():
        tree = spec.tree
        seq = b.prompt_token_ids + b.token_ids
        match = tree.match_prefix(seq)
        # everything the tree holds for this prompt is a prefix of the true sequence
        return match.length, tree.total_pages * tree.page_size

    matched, total = spec.scheduler.call(cached_tokens)
    assert matched == total > len(b.prompt_token_ids)
    spec.check_integrity()


def test_stop_strings_max_tokens_and_min_tokens(engines, oracle):
    base, spec = engines
    _, ref = _ref(base, REPEAT, max_new_tokens=40, ignore_eos=True)
    oracle([ref])
    stop = base.generate(REPEAT, max_new_tokens=12, temperature=0.0, ignore_eos=True).text[-6:]
    for kw in (
        {"max_new_tokens": 7},
        {"max_new_tokens": 1},
        {"max_new_tokens": 30, "min_new_tokens": 20},
        {"max_new_tokens": 40, "stop": stop},
    ):
        a = base.generate(REPEAT, temperature=0.0, ignore_eos=True, **kw)
        b = spec.generate(REPEAT, temperature=0.0, ignore_eos=True, **kw)
        assert (b.token_ids, b.text, b.finish_reason, b.matched_stop) == (
            a.token_ids, a.text, a.finish_reason, a.matched_stop), kw  # fmt: skip
    spec.check_integrity()


def test_streaming_gives_the_same_text(engines, oracle):
    base, spec = engines
    a, ref = _ref(base, REPEAT, max_new_tokens=30, ignore_eos=True)
    oracle([ref])
    chunks = list(spec.generate(REPEAT, stream=True, max_new_tokens=30, temperature=0.0,
                                ignore_eos=True))  # fmt: skip
    assert "".join(c.text_delta for c in chunks) == a.text
    assert [t for c in chunks for t in c.token_ids] == a.token_ids
    assert chunks[-1].finished and chunks[-1].result.token_ids == a.token_ids


def test_a_batch_with_and_without_drafts_in_one_step(engines, oracle):
    base, spec = engines
    refs = [_ref(base, p, max_new_tokens=24, ignore_eos=True) for p in PROMPTS]
    oracle([refs[0][1], refs[1][1]])  # the third request gets no drafts
    outs = spec.generate(PROMPTS, max_new_tokens=24, temperature=0.0, ignore_eos=True)
    assert [o.token_ids for o in outs] == [r[0].token_ids for r in refs]
    spec.check_integrity()


def test_sampling_runs_and_respects_limits(engines, oracle):
    base, spec = engines
    _, ref = _ref(base, REPEAT, max_new_tokens=40, ignore_eos=True)
    oracle([ref])
    outs = spec.generate([REPEAT] * 3, max_new_tokens=25, temperature=0.7, top_p=0.9,
                         ignore_eos=True, logprobs=True)  # fmt: skip
    for out in outs:
        assert len(out.token_ids) == 25 and len(out.logprobs) == 25
        assert all(lp <= 0.0 for lp in out.logprobs)
    seeded = [spec.generate(REPEAT, max_new_tokens=20, temperature=0.9, seed=7) for _ in range(2)]
    assert seeded[0].token_ids == seeded[1].token_ids  # a seed gives one sequence of draws
    spec.check_integrity()


def test_large_batches_step_aside(model_dir):
    with Engine(str(model_dir), max_total_tokens=4096, speculative_algorithm="NGRAM",
                speculative_disable_by_batch_size=2) as spec:  # fmt: skip
        spec.generate([PROMPTS[1]] * 4, max_new_tokens=12, temperature=0.0, ignore_eos=True)
        # the same batch verifies 16 times without stepping aside; here at most the tail, where
        # requests admitted a step apart leave two or fewer decoding (as CI once saw)
        assert spec.stats()["spec_verify_steps"] <= 2
        spec.generate(PROMPTS[1], max_new_tokens=12, temperature=0.0, ignore_eos=True)
        assert spec.stats()["spec_verify_steps"] > 0


def test_verify_rows_through_the_decode_graph_runner(model_dir, engines):
    """`cuda_graph_bs` on the CPU: decode steps (short verifies included, as decode rows)
    replayed on padded static buffers, which return every row's logits."""
    base, _ = engines
    for kw in ({"max_new_tokens": 40, "ignore_eos": True},
               {"max_new_tokens": 60, "json_schema": json.dumps(SCHEMA)}):  # fmt: skip
        prompt = REPEAT if "json_schema" not in kw else PROMPT
        want = base.generate(prompt, temperature=0.0, **kw)
        with Engine(str(model_dir), max_total_tokens=4096, cuda_graph_bs=[1, 2, 4, 8],
                    speculative_algorithm="NGRAM",
                    speculative_num_draft_tokens=2) as spec:  # fmt: skip
            speculator = spec.scheduler.speculation
            proposer = OracleProposer([want.prompt_token_ids + want.token_ids], wrong_every=3)
            spec.scheduler.call(lambda s=speculator: setattr(s, "cost_aware", False))
            spec.scheduler.call(lambda s=speculator, p=proposer: setattr(s, "proposer", p))
            got = spec.generate(prompt, temperature=0.0, **kw)
            assert got.token_ids == want.token_ids
            assert spec.stats()["spec_verify_steps"] > 0
            if "json_schema" not in kw:  # (the tiny model's JSON is mostly forced text)
                assert spec.stats()["graph_replays"] > 0
            spec.check_integrity()


def test_verify_costs_are_recorded_at_the_forwards_row_count(engines, oracle):
    # a verify of d drafts for one request is a forward of 1 + d rows; the cost model keys its
    # measurement by that (counting after the step, the tokens the verify appended were
    # added too, and a 1-draft verify's cost was filed under 3 rows)
    base, spec = engines
    _, ref = _ref(base, REPEAT, max_new_tokens=24, ignore_eos=True)
    oracle([ref], 3)
    costs = spec.scheduler.speculation.costs
    seen: list[int] = []
    original = costs.observe_verify

    def spy(batch: int, rows: int, seconds: float) -> None:
        seen.append(rows - batch)
        original(batch, rows, seconds)

    spec.scheduler.call(lambda: setattr(costs, "observe_verify", spy))
    try:
        spec.generate(REPEAT, max_new_tokens=24, temperature=0.0, ignore_eos=True)
    finally:
        spec.scheduler.call(lambda: delattr(costs, "observe_verify"))
    drafts = spec.scheduler.speculation.config.num_draft_tokens
    assert seen and all(1 <= d <= drafts for d in seen), seen
