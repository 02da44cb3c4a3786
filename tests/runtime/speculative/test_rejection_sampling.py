"""The acceptance rule for a point-mass (n-gram) draft keeps the target distribution: the
tokens it yields, over many draws, follow p whichever token is drafted."""

from __future__ import annotations

import pytest
import torch

from runtime.scheduling.request import Request, SamplingParams
from runtime.speculative.verify import choose_token


def _draws(logits: torch.Tensor, params: SamplingParams, draft: int | None, n: int) -> torch.Tensor:
    req = Request([1], params)
    gen = torch.Generator().manual_seed(1234)
    counts = torch.zeros(logits.shape[0])
    for _ in range(n):
        counts[choose_token(logits[None].clone(), req, draft, gen)] += 1
    return counts / n


@pytest.mark.parametrize("draft", [0, 2, 5, None])
def test_accepted_or_resampled_tokens_follow_the_target_distribution(draft):
    logits = torch.tensor([2.0, 0.5, 1.5, -1.0, 0.0, 1.0])
    params = SamplingParams(temperature=0.8)
    target = torch.softmax(logits / 0.8, dim=-1)
    n = 6000
    freq = _draws(logits, params, draft, n)
    # each frequency within 4.5 standard errors of its probability
    bound = 4.5 * torch.sqrt(target * (1 - target) / n) + 1e-3
    assert torch.all((freq - target).abs() <= bound), (freq, target)


def test_truncation_is_part_of_the_target():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    params = SamplingParams(temperature=1.0, top_k=2)
    freq = _draws(logits, params, draft=3, n=3000)  # a draft top-k removes: never kept
    assert freq[2] == 0 and freq[3] == 0
    target = torch.softmax(torch.tensor([3.0, 2.0]), dim=-1)
    assert abs(float(freq[0]) - float(target[0])) < 0.04


def test_greedy_keeps_a_draft_only_when_it_is_the_argmax():
    logits = torch.tensor([[0.1, 2.0, 0.3]])
    req = Request([1], SamplingParams(temperature=0.0))
    gen = torch.Generator()
    assert choose_token(logits.clone(), req, 1, gen) == 1
    assert choose_token(logits.clone(), req, 2, gen) == 1
