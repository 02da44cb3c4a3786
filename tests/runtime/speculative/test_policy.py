"""The cost-aware policy on given step costs: drafting where the expected tokens per second
beat decoding, not where they do not; measuring first; exploring now and then."""

from __future__ import annotations

import pytest

from runtime.speculative.policy import (
    EXPLORE,
    EXPLORE_CAP,
    FIRST_CAP,
    HOPELESS,
    StepCosts,
    acceptance,
    expected_tokens,
)
from runtime.speculative.speculator import ACCEPT_DECAY


def test_expected_tokens():
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def _costs(decode: float, per_row: float, fixed: float) -> StepCosts:
    """Batch-1 decode in `decode` s; a verify of r rows in fixed + per_row * r s."""
    costs = StepCosts()
    costs.observe_decode(1, decode)
    for rows in (2, 5, 9):
        costs.observe_verify(1, rows, fixed + per_row * rows)
    return costs


def test_measures_before_deciding():
    costs = StepCosts()
    assert costs.choose_cap(1, [0.9], [8], model_forwards=False) == 0  # no decode measured
    costs.observe_decode(1, 0.01)
    assert costs.choose_cap(1, [0.9], [8], model_forwards=False) == FIRST_CAP  # no verify yet


def test_verify_time_between_and_past_measured_row_counts():
    costs = _costs(0.01, 0.004, 0.01)
    assert costs.verify_time(5) == pytest.approx(0.03)
    assert costs.verify_time(7) == pytest.approx(0.01 + 0.004 * 7)
    costs.observe_verify(1, 4, 0.2)  # a loaded step: 7x what its row count costs
    costs.observe_verify(1, 12, 0.01 + 0.004 * 12)
    assert costs.verify_time(7) == pytest.approx(0.01 + 0.004 * 7)
    costs.observe_verify(1, 60, 1.0)  # more rows than MAX_ROWS past the batch: not kept
    assert 60 not in costs.verify
    assert costs.verify_time(16) == pytest.approx(0.01 + 0.004 * 16)  # the slope past them
    costs.observe_verify(1, 6, 0.05)  # a path that costs more from 6 rows on: followed
    costs.observe_verify(1, 6, 0.05)
    assert costs.verify_time(6) == pytest.approx(0.05)
    assert costs.verify_time(5) == pytest.approx(0.03)


def test_high_acceptance_drafts_low_does_not():
    costs = _costs(0.01, 0.004, 0.01)  # a verify of 9 rows costs 4.6 decodes
    assert costs.choose_cap(1, [0.95], [8], model_forwards=False) >= 4
    assert costs.choose_cap(1, [0.3], [8], model_forwards=False) == 0
    cheap = _costs(0.01, 0.0002, 0.0098)  # rows nearly free: even low acceptance pays
    assert cheap.choose_cap(1, [0.3], [8], model_forwards=False) > 0


def test_draft_model_forwards_count():
    costs = _costs(0.01, 0.001, 0.009)
    assert costs.choose_cap(1, [0.8], [8], model_forwards=True) > 0
    costs.observe_draft(1, 4, 4 * 0.02)  # a draft forward dearer than a target decode
    assert costs.choose_cap(1, [0.8], [8], model_forwards=True) == 0


def test_explores_after_a_run_of_no_drafts():
    # a draft model's acceptance is only measured by verifying: it explores however low
    costs = _costs(0.01, 0.004, 0.01)
    caps = [costs.choose_cap(1, [0.1], [8], model_forwards=True) for _ in range(2 * EXPLORE)]
    assert caps.count(EXPLORE_CAP) == 2 and caps.count(0) == 2 * EXPLORE - 2
    # n-gram drafts are measured against the output for free: they explore only for a close
    # call (a request keeping half its drafts), never for text that does not copy
    caps = [costs.choose_cap(1, [0.1], [8], model_forwards=False) for _ in range(2 * EXPLORE)]
    assert caps.count(0) == 2 * EXPLORE
    caps = [costs.choose_cap(1, [0.55], [8], model_forwards=False) for _ in range(2 * EXPLORE)]
    assert caps.count(EXPLORE_CAP) == 2 and caps.count(0) == 2 * EXPLORE - 2


def test_a_request_that_never_keeps_a_draft_does_not_verify_two_rows():
    # a 2-row verify measured at 1.02 decode steps (noise: it costs ~1.25): only an acceptance
    # above 0.12 pays, and a request whose every chain was rejected at once settles below it
    costs = StepCosts()
    costs.observe_decode(1, 0.01)
    costs.observe_verify(1, 2, 0.0102)
    accept = reject = 0.0
    for _ in range(20):
        accept, reject = ACCEPT_DECAY * accept, ACCEPT_DECAY * reject + 1
    assert costs.choose_cap(1, [acceptance(accept, reject)], [1], model_forwards=False) == 0
    assert costs.choose_cap(1, [0.5], [1], model_forwards=False) == 1


def test_acceptance_prior_and_measurement():
    assert acceptance(0.0, 0.0) == pytest.approx(0.5)
    assert acceptance(40.0, 1.0) > 0.9
    assert acceptance(0.0, 10.0) < 0.1


def test_a_draft_model_that_cannot_pay_explores_rarely():
    # a draft forward at 0.8 of a target decode step and a verify dearer per row than that:
    # even drafts that all hold lose, so exploring (and the draft's catch-up it costs) is rare
    costs = _costs(0.01, 0.004, 0.01)
    costs.observe_draft(1, 4, 4 * 0.008)
    costs.observe_draft(1, 4, 4 * 0.008)
    n = 2 * EXPLORE * HOPELESS
    caps = [costs.choose_cap(1, [0.9], [8], model_forwards=True) for _ in range(n)]
    assert caps.count(EXPLORE_CAP) == 2 and caps.count(0) == n - 2
    # a cheap draft forward: drafts that hold pay, so it explores at the usual rate
    costs = _costs(0.01, 0.004, 0.01)
    costs.observe_draft(1, 4, 4 * 0.0005)
    costs.observe_draft(1, 4, 4 * 0.0005)
    caps = [costs.choose_cap(1, [0.1], [8], model_forwards=True) for _ in range(2 * EXPLORE)]
    assert caps.count(EXPLORE_CAP) == 2


def test_unverified_drafts_resolve_once_enough_came_true():
    """A request's shadow (n-gram drafts offered, not verified) counts as a held chain once
    SHADOW_EARLY of its drafts came true in a row, not only after all of them did (it blocks
    the request's lookups and verifies while pending); a wrong one counts a rejection."""
    from types import SimpleNamespace

    from runtime.scheduling.request import SpecState
    from runtime.speculative.config import SpeculativeConfig
    from runtime.speculative.speculator import SHADOW_EARLY, Speculator

    spec = Speculator(SpeculativeConfig("NGRAM"))
    drafts = list(range(100, 108))
    req = SimpleNamespace(spec=SpecState(shadow=list(drafts), shadow_at=10), seq=list(range(10)))
    for n in range(1, SHADOW_EARLY):
        req.seq.append(drafts[n - 1])
        spec._shadow_check(req)
        assert req.spec.shadow == drafts and req.spec.accept_w == 0.0  # true so far: pending
    req.seq.append(drafts[SHADOW_EARLY - 1])
    spec._shadow_check(req)
    assert req.spec.shadow == [] and req.spec.accept_w == SHADOW_EARLY < len(drafts)
    assert req.spec.reject_w == 0.0
    miss = SimpleNamespace(spec=SpecState(shadow=list(drafts), shadow_at=2), seq=[0, 1, 100, 9])
    spec._shadow_check(miss)
    assert miss.spec.shadow == [] and (miss.spec.accept_w, miss.spec.reject_w) == (1.0, 1.0)
