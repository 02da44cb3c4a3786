"""Long verifies as decode rows: one request's rows (the same pages) are not a cascade group,
so a quantized model keeps its one-call decode path for them, and the output stays the one
of decoding without speculation."""

from __future__ import annotations

import pytest
import torch

from runtime import Engine
from runtime.kernels.cascade import plan_cascade
from runtime.models.llama import LlamaModel
from runtime.scheduling.step_plan import VERIFY_DECODE_ROWS
from tests.runtime.speculative.conftest import OracleProposer

PS = 16


def _rows(requests: int, rows_each: int, prefix_pages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode rows of `requests` requests sharing `prefix_pages` pages, each with its own tail
    page and `rows_each` rows (a verify: consecutive lengths, one page table)."""
    table, lens = [], []
    for r in range(requests):
        pages = list(range(1, 1 + prefix_pages)) + [1000 + r]
        for i in range(rows_each):
            table.append(pages)
            lens.append(prefix_pages * PS + 1 + i)
    return torch.tensor(table, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize(
    ("requests", "rows_each", "useful"),
    [
        pytest.param(1, 9, False, id="one-request-9-verify-rows"),
        pytest.param(2, 9, False, id="two-requests-verifying"),
        pytest.param(4, 1, True, id="four-requests-decoding"),
        pytest.param(4, 5, True, id="four-requests-verifying"),
    ],
)
def test_a_cascade_group_counts_requests_not_rows(requests, rows_each, useful):
    # a 1,008-token prefix: 8 rows of one request would "save" 8 x 1,008 reads as rows
    table, lens = _rows(requests, rows_each, prefix_pages=63)
    assert plan_cascade(table, lens, PS).useful == useful


@pytest.fixture(scope="module")
def quantized(model_dir):
    """(a q8_0 engine without speculation, one verifying every 8-draft n-gram chain)."""
    base = Engine(str(model_dir), max_total_tokens=4096, quantization="q8_0")
    spec = Engine(str(model_dir), max_total_tokens=4096, quantization="q8_0",
                  speculative_algorithm="NGRAM", speculative_num_draft_tokens=8)  # fmt: skip
    spec.scheduler.call(lambda: setattr(spec.scheduler.speculation, "cost_aware", False))
    yield base, spec
    base.shutdown()
    spec.shutdown()


def test_long_verifies_run_through_the_decode_chain(quantized, monkeypatch):
    base, spec = quantized
    assert VERIFY_DECODE_ROWS >= 9
    prompt = " ".join(f"item {i} is {i * 7 % 13}." for i in range(120))  # ~ 900 tokens
    kw = {"max_new_tokens": 40, "temperature": 0.0, "ignore_eos": True}
    want = base.generate(prompt, **kw)
    assert len(want.prompt_token_ids) > 600
    chained: list[int] = []  # row counts of the forwards that took the decode chain
    original = LlamaModel._chained

    def counting(self, hidden, pool):
        out = original(self, hidden, pool)
        if out is not None:
            chained.append(hidden.shape[0])
        return out

    monkeypatch.setattr(LlamaModel, "_chained", counting)
    speculator = spec.scheduler.speculation
    proposer = OracleProposer([want.prompt_token_ids + want.token_ids], wrong_every=5)
    original_proposer = speculator.proposer
    spec.scheduler.call(lambda: setattr(speculator, "proposer", proposer))
    try:
        got = spec.generate(prompt, **kw)
    finally:
        spec.scheduler.call(lambda: setattr(speculator, "proposer", original_proposer))
    assert got.token_ids == want.token_ids
    assert spec.stats()["spec_verify_steps"] > 0
    # 4 right drafts then a wrong one: verifies of 5 or more rows, on the one-call path
    assert chained and max(chained) >= 5
    spec.check_integrity()
