"""n-gram speculation with tensor parallelism (two gloo ranks) and on the decode side of
prefill-decode disaggregation: greedy tokens equal those of one engine without speculation,
and verify steps did run."""

from __future__ import annotations

import pytest

from runtime import Engine
from tests.cluster.test_disaggregation_engine import pd, pool_whole

pytestmark = pytest.mark.timeout(300)
# a prompt that repeats itself: n-gram lookup proposes from it whatever the random model writes
REPEAT = " ".join(f"row {i % 5} says {i % 3}." for i in range(40))
GREEDY = dict(max_new_tokens=24, temperature=0.0, ignore_eos=True)
ENGINE = dict(page_size=4, max_total_tokens=2048)
SPEC = dict(speculative_algorithm="NGRAM", speculative_num_draft_tokens=4)


def _verify_everything(engine: Engine) -> None:
    """Every proposal verified (these tests check verification, not when drafting pays)."""
    engine.scheduler.call(lambda: setattr(engine.scheduler.speculation, "cost_aware", False))


@pytest.fixture(scope="module")
def reference(model_dir):
    with Engine(str(model_dir), **ENGINE) as e:
        return [r.token_ids for r in e.generate([REPEAT, "The cat sat on the"], **GREEDY)]


def test_tensor_parallel_verifies_give_the_same_tokens(model_dir, reference):
    with Engine(str(model_dir), tp_size=2, **ENGINE, **SPEC) as e:
        _verify_everything(e)
        got = [r.token_ids for r in e.generate([REPEAT, "The cat sat on the"], **GREEDY)]
        assert got == reference
        assert e.stats()["spec_verify_steps"] > 0
        e.check_integrity()


def test_decode_side_speculation_gives_the_same_tokens(model_dir, reference):
    with Engine(str(model_dir), disaggregation_mode="prefill", disaggregation_bootstrap_port=0,
                disaggregation_bootstrap_host="127.0.0.1", disaggregation_timeout_s=3,
                **ENGINE) as prefill, \
         Engine(str(model_dir), disaggregation_mode="decode", disaggregation_timeout_s=3,
                **ENGINE, **SPEC) as decode:  # fmt: skip
        _verify_everything(decode)
        for prompt, want in zip([REPEAT, "The cat sat on the"], reference, strict=True):
            got, pre = pd(prefill, decode, prompt, **GREEDY)
            assert got.token_ids == want
            assert pre.token_ids == want[:1]  # the prefill side computed the first token only
        assert decode.stats()["spec_verify_steps"] > 0
        for e in (prefill, decode):
            pool_whole(e)
