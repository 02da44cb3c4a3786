"""STANDALONE speculation (a draft model): greedy output equal to the engine's without
speculation with a draft of the target's own weights (drafts kept) and with another random
draft (drafts rejected); constrained outputs; the draft's KV pages all free again; a draft
with another vocabulary refused by name; vLLM's draft_model config."""

from __future__ import annotations

import json

import jsonschema
import pytest

from runtime import Engine
from runtime.speculative.config import SpeculativeConfigError
from tests.runtime.speculative.test_constrained_speculation import PROMPT, SCHEMA
from tests.support.tiny_models import PROMPTS, make_tiny_model


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory):
    """A tiny random Llama of other weights, the same vocabulary."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-draft"), seed=1)


def _draft_engine(target, draft, k=4):
    engine = Engine(str(target), max_total_tokens=4096, speculative_algorithm="STANDALONE",
                    speculative_draft_model_path=str(draft),
                    speculative_num_draft_tokens=k)  # fmt: skip
    # every draft verified: these tests check the drafts, not when drafting pays
    engine.scheduler.call(lambda: setattr(engine.scheduler.speculation, "cost_aware", False))
    return engine


@pytest.fixture(scope="module")
def drafting(model_dir, other_draft):
    """(no speculation, draft = the target's weights, draft = other random weights)."""
    engines = (Engine(str(model_dir), max_total_tokens=4096), _draft_engine(model_dir, model_dir),
               _draft_engine(model_dir, other_draft, k=3))  # fmt: skip
    yield engines
    for engine in engines:
        engine.shutdown()


def _draft_pool_free(engine) -> bool:
    """Every draft page free or kept for a later request (no running request holds one)."""
    draft = engine.scheduler.speculation.draft
    free, kept, held = engine.scheduler.call(
        lambda: (draft.pool.num_free_pages, draft.retired_pages, len(draft.seqs))
    )
    return held == 0 and free + kept == draft.pool.num_pages - 1


def test_greedy_output_is_the_target_s(drafting):
    base, same, other = drafting
    prompts = PROMPTS[:3]
    want = [o.token_ids for o in base.generate(prompts, max_new_tokens=40, temperature=0.0,
                                                ignore_eos=True)]  # fmt: skip
    for engine in (same, other):
        before = engine.stats()
        got = engine.generate(prompts, max_new_tokens=40, temperature=0.0, ignore_eos=True)
        assert [o.token_ids for o in got] == want
        stats = engine.stats()
        assert stats["spec_verify_steps"] > before["spec_verify_steps"]
        engine.check_integrity()
        assert _draft_pool_free(engine)
    # the target's own weights draft what it decodes; other weights mostly not
    assert same.stats()["spec_accept_rate"] > 0.8
    assert other.stats()["spec_accept_rate"] < 0.5


def test_a_repeated_prompt_reuses_the_draft_kv(drafting):
    base, same, _ = drafting
    prompt = PROMPTS[1] * 3
    kw = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    want = base.generate(prompt, **kw).token_ids
    draft = same.scheduler.speculation.draft
    first = same.generate(prompt, **kw)
    before = same.scheduler.call(lambda: draft.computed)
    again = same.generate(prompt, **kw)
    caught_up = same.scheduler.call(lambda: draft.computed) - before
    assert first.token_ids == again.token_ids == want
    assert caught_up < len(first.prompt_token_ids) // 2  # the prompt's draft KV was kept
    assert _draft_pool_free(same)


def test_sampled_output_keeps_its_length_and_seed(drafting):
    _, same, _ = drafting
    outs = [same.generate(PROMPTS[0], max_new_tokens=24, temperature=0.8, seed=5,
                          ignore_eos=True) for _ in range(2)]  # fmt: skip
    assert len(outs[0].token_ids) == 24 and outs[0].token_ids == outs[1].token_ids
    assert outs[0].usage.spec_verify_ct > 0


@pytest.mark.parametrize("jump_forward", [True, False])
def test_constrained_drafts(drafting, jump_forward):
    base, same, other = drafting
    kw = {"json_schema": json.dumps(SCHEMA), "jump_forward": jump_forward}
    a = base.generate(PROMPT, max_new_tokens=60, temperature=0.0, **kw)
    for engine in (same, other):
        b = engine.generate(PROMPT, max_new_tokens=60, temperature=0.0, **kw)
        assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
        if b.finish_reason == "stop":
            jsonschema.validate(json.loads(b.text), SCHEMA)
        engine.check_integrity()


def test_preempted_requests_free_their_draft_pages(model_dir):
    """A pool too small for the batch: requests are preempted and resumed, output unchanged."""
    kw = {"max_new_tokens": 48, "temperature": 0.0, "ignore_eos": True}
    with Engine(str(model_dir), max_total_tokens=4096) as base:
        want = [o.token_ids for o in base.generate(PROMPTS[:4], **kw)]
    with Engine(str(model_dir), max_total_tokens=160, page_size=16,
                speculative_algorithm="STANDALONE", speculative_draft_model_path=str(model_dir),
                speculative_disable_by_batch_size=8) as engine:  # fmt: skip
        engine.scheduler.call(lambda: setattr(engine.scheduler.speculation, "cost_aware", False))
        got = [o.token_ids for o in engine.generate(PROMPTS[:4], **kw)]
        assert engine.stats()["preemptions"] > 0
        assert got == want
        assert _draft_pool_free(engine)


def test_vllm_draft_model_config(model_dir):
    config = {"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": 3}
    with Engine(str(model_dir), max_total_tokens=1024, speculative_config=config) as engine:
        assert engine.speculative.algorithm == "STANDALONE"
        assert engine.speculative.num_draft_tokens == 3
        assert engine.scheduler.speculation.draft is not None


def test_another_vocabulary_is_refused(model_dir, tmp_path):
    draft = make_tiny_model(tmp_path / "small-vocab", vocab_size=1000)
    with pytest.raises(SpeculativeConfigError, match="speculative_draft_model_path.*vocabulary"):
        Engine(str(model_dir), max_total_tokens=1024, speculative_algorithm="STANDALONE",
               speculative_draft_model_path=str(draft))  # fmt: skip
    with pytest.raises(SpeculativeConfigError, match="speculative_draft_model_path"):
        Engine(str(model_dir), max_total_tokens=1024, speculative_algorithm="STANDALONE",
               speculative_draft_model_path=str(tmp_path / "missing"))  # fmt: skip


def test_quantized_target_verifies_through_its_decode_path(model_dir):
    """A q8_0 target (its decode-only steps run as one C call per step): verify rows go through
    that path as decode rows, and the output is still the target's own."""
    kw = {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    with Engine(str(model_dir), max_total_tokens=2048, quantization="q8_0") as base:
        want = [o.token_ids for o in base.generate(PROMPTS[:3], **kw)]
    with Engine(str(model_dir), max_total_tokens=2048, quantization="q8_0",
                speculative_algorithm="STANDALONE",
                speculative_draft_model_path=str(model_dir)) as engine:  # fmt: skip
        engine.scheduler.call(lambda: setattr(engine.scheduler.speculation, "cost_aware", False))
        assert [o.token_ids for o in engine.generate(PROMPTS[:3], **kw)] == want
        stats = engine.stats()
        assert stats["spec_verify_steps"] > 0 and stats["spec_accept_rate"] > 0.5
