"""The n-gram proposer's lookup, and the speculative options (SGLang's keywords, vLLM's
speculative_config) read into one record or refused by name."""

from __future__ import annotations

import random

import pytest

from runtime.speculative.config import SpeculativeConfigError, speculative_config
from runtime.speculative.ngram import NgramProposer


def test_the_longest_earlier_suffix_gives_the_drafts():
    p = NgramProposer(1, 4)
    #        0  1  2  3  4  5  6  7  8  9
    tokens = [5, 1, 2, 3, 9, 1, 2, 7, 1, 2]
    # suffix [1, 2] occurs at 1..2 (then 3) and 5..6 (then 7): the latest wins
    assert p.propose(tokens, 2) == [7, 1]
    # a longer suffix beats a later, shorter one
    tokens = [4, 1, 2, 3, 8, 2, 6, 0, 4, 1, 2]
    assert p.propose(tokens, 3) == [3, 8, 2]


def test_no_match_gives_no_drafts_and_k_bounds_them():
    p = NgramProposer(1, 3)
    assert p.propose([1, 2, 3, 4], 5) == []
    assert p.propose([7, 8, 9, 10, 11, 7], 2) == [8, 9]
    assert p.propose([7, 8, 9, 10, 11, 7], 0) == []
    assert p.propose([], 3) == []


def test_the_minimum_window_is_honoured():
    assert NgramProposer(2, 4).propose([1, 5, 6, 2, 5], 3) == []  # only [5] matches
    assert NgramProposer(2, 4).propose([1, 5, 6, 2, 1, 5], 3) == [6, 2, 1]


def test_the_window_never_reaches_past_its_maximum():
    # [0, 1, 2] matches 3 tokens at the start, but the window stops at 2: a tie between the
    # two [1, 2] occurrences, the latest wins
    tokens = [0, 1, 2, 5, 9, 1, 2, 6, 0, 1, 2]
    assert NgramProposer(1, 2).propose(tokens, 1) == [6]
    assert NgramProposer(1, 3).propose(tokens, 1) == [5]


def _longest_earlier_suffix(tokens: list[int], lo: int, hi: int, k: int) -> list[int]:
    """The definition, by brute force: the longest suffix (lo..hi tokens) that also ends at an
    earlier position, its latest such position, the k tokens after it in the tokens followed
    by the drafts themselves (a recent occurrence: the period repeats)."""
    n = len(tokens)
    for length in range(min(hi, n - 1), lo - 1, -1):
        ends = [
            i
            for i in range(length - 1, n - 1)
            if tokens[i - length + 1 : i + 1] == tokens[n - length :]
        ]
        if ends:
            seq = list(tokens)
            for j in range(k):
                seq.append(seq[ends[-1] + 1 + j])
            return seq[n:]
    return []


def test_a_recent_occurrence_repeats_its_period():
    p = NgramProposer(1, 4)
    # [1, 2] last occurred just before: the text repeats [1, 2] (only 2 tokens follow it)
    assert p.propose([5, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]
    # period 3: [7, 8, 9] and the suffix [8, 9] ends 3 back
    assert p.propose([7, 8, 9, 7, 8, 9], 4) == [7, 8, 9, 7]


def test_the_lookup_equals_its_definition_on_random_sequences():
    rng = random.Random(7)
    for _ in range(400):
        vocab = rng.choice([2, 3, 6, 40])
        tokens = [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))]
        lo = rng.randrange(1, 4)
        hi, k = rng.randrange(lo, 10), rng.randrange(0, 6)
        want = _longest_earlier_suffix(tokens, lo, hi, k) if k else []
        assert NgramProposer(lo, hi).propose(tokens, k) == want, (tokens, lo, hi, k)


def test_off_by_default_and_sglang_keywords():
    assert speculative_config() is None
    cfg = speculative_config("ngram", num_draft_tokens=5, ngram_max_match_window_size=6)
    assert (cfg.algorithm, cfg.num_draft_tokens, cfg.ngram_max_match_window_size) == (
        "NGRAM", 5, 6)  # fmt: skip
    assert speculative_config("NGRAM", num_steps=3).num_draft_tokens == 3
    assert speculative_config("NGRAM").num_draft_tokens == 8


def test_vllm_speculative_config_in_the_same_terms():
    cfg = speculative_config(
        vllm_config='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5,'
        ' "prompt_lookup_min": 2}'
    )
    assert (cfg.algorithm, cfg.num_draft_tokens) == ("NGRAM", 4)
    assert (cfg.ngram_min_match_window_size, cfg.ngram_max_match_window_size) == (2, 5)


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"algorithm": "EAGLE"}, "speculative_algorithm"),
        ({"algorithm": "STANDALONE"}, "speculative_draft_model_path"),
        ({"algorithm": "NGRAM", "draft_model_path": "x"}, "speculative_draft_model_path"),
        ({"algorithm": "NGRAM", "num_draft_tokens": 0}, "speculative_num_draft_tokens"),
        (
            {
                "algorithm": "NGRAM",
                "ngram_min_match_window_size": 5,
                "ngram_max_match_window_size": 2,
            },
            "speculative_ngram_min_match_window_size",
        ),
        ({"num_draft_tokens": 4}, "speculative_algorithm"),
        ({"vllm_config": {"method": "eagle"}}, "speculative_config.method"),
        ({"vllm_config": {"method": "ngram", "top_k": 3}}, "'top_k'"),
        ({"vllm_config": "{not json"}, "speculative_config"),
        ({"algorithm": "NGRAM", "vllm_config": {"method": "draft_model"}}, "disagree"),
    ],
)
def test_bad_options_are_refused_by_name(kwargs, named):
    with pytest.raises(SpeculativeConfigError, match=named):
        speculative_config(**kwargs)
