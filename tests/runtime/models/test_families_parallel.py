"""The shared-decoder families through the parallel workers (torch.distributed, gloo): tensor
parallel for the dense ones (Qwen3, Gemma 3 with its windows, Phi-3 with its fused projections
split at load), experts spread over tensor or expert parallel ranks for Qwen3-MoE and Mixtral,
pipeline stages over Gemma 3's local / global layers; greedy tokens equal the single-process
engine's with the radix cache, chunked prefill and preemption in play."""

from __future__ import annotations

import pytest

from runtime import Engine
from tests.support.family_models import make_family_model
from tests.support.tiny_models import PROMPTS

pytestmark = pytest.mark.timeout(300)
GREEDY = dict(max_new_tokens=8, min_new_tokens=8, temperature=0.0)
ENGINE = dict(page_size=4, chunked_prefill_tokens=16, max_total_tokens=96)


@pytest.mark.parametrize(
    "kind, sizes",
    [
        pytest.param("qwen3", dict(tp_size=2), id="qwen3-tp2"),
        pytest.param("gemma3", dict(tp_size=2), id="gemma3-tp2"),
        pytest.param("gemma3", dict(pp_size=2), id="gemma3-pp2"),
        pytest.param("phi3", dict(tp_size=2), id="phi3-tp2"),
        pytest.param("qwen3_moe", dict(tp_size=2), id="qwen3-moe-tp2"),
        pytest.param("mixtral", dict(ep_size=2), id="mixtral-ep2"),
    ],
)
def test_greedy_tokens_equal_the_single_process_engine(tmp_path, kind, sizes):
    folder = make_family_model(tmp_path / "m", kind)
    prompts = PROMPTS[:4] * 2
    with Engine(str(folder), **ENGINE) as e:
        expected = [r.token_ids for r in e.generate(prompts, **GREEDY)]
    with Engine(str(folder), **ENGINE, **sizes) as e:
        assert [r.token_ids for r in e.generate(prompts, **GREEDY)] == expected
        assert e.stats()["preemptions"] > 0
