"""The overlap scheduler (runtime/scheduling/overlap.py) changes no output: greedy equals
transformers' with it on, alone and batched, through chunked prefill, preemption, stop strings,
streams, aborts and constraints; the fast greedy argmax equals torch's; the thread chooser
(runtime/models/threads.py) switches counts without changing tokens."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from runtime import Engine
from runtime.scheduling.sampling import greedy_tokens
from tests.support.tiny_models import PROMPTS, hf_greedy, hf_model

N = 12
GREEDY = dict(max_new_tokens=N, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def expected(model_dir):
    from transformers import AutoTokenizer

    hf, tok = hf_model(model_dir), AutoTokenizer.from_pretrained(str(model_dir))
    return {p: hf_greedy(hf, tok(p).input_ids, N) for p in PROMPTS}


@pytest.fixture(scope="module")
def engine(model_dir):
    with Engine(model_dir, page_size=4, max_total_tokens=4096, overlap_schedule=True) as e:
        yield e


def test_greedy_batch_matches_transformers_and_plans_ahead(engine, expected):
    before = engine.stats()["steps_planned_ahead"]
    results = engine.generate(PROMPTS * 2, **GREEDY)
    assert [r.token_ids for r in results] == [expected[p] for p in PROMPTS * 2]
    stats = engine.stats()
    assert stats["overlap_schedule"] is True
    assert stats["steps_planned_ahead"] > before
    engine.check_integrity()


def test_requests_of_different_lengths_finish_mid_batch(engine, expected):
    lengths = [3, N, 1, 7, N, 5]

    def run(pair):
        prompt, k = pair
        return engine.generate(prompt, max_new_tokens=k, temperature=0.0, ignore_eos=True)

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # concurrent: they share decode steps
        results = list(pool.map(run, zip(PROMPTS, lengths, strict=True)))
    assert [r.token_ids for r in results] == [
        expected[p][:k] for p, k in zip(PROMPTS, lengths, strict=True)
    ]
    engine.check_integrity()


def test_chunked_prefill_and_preemption(model_dir, expected):
    with Engine(model_dir, page_size=4, max_total_tokens=96, chunked_prefill_tokens=16,
                overlap_schedule=True) as e:  # fmt: skip
        results = e.generate(PROMPTS * 2, **GREEDY)
        assert [r.token_ids for r in results] == [expected[p] for p in PROMPTS * 2]
        e.check_integrity()


def test_stream_stop_string_and_abort(engine, expected):
    chunks = list(engine.generate(PROMPTS[1], stream=True, **GREEDY))
    assert [t for c in chunks for t in c.token_ids] == expected[PROMPTS[1]]
    full = engine.generate(PROMPTS[3], **GREEDY).text
    stop = full[len(full) // 2 :][:3]
    if stop.strip():
        cut = engine.generate(PROMPTS[3], stop=stop, max_new_tokens=N, temperature=0.0)
        assert stop not in cut.text and full.startswith(cut.text)
    it = engine.generate(PROMPTS[0], stream=True, max_new_tokens=500, ignore_eos=True)
    next(iter(it))
    it.close()
    assert engine.generate(PROMPTS[0], **GREEDY).token_ids == expected[PROMPTS[0]]
    engine.check_integrity()


def test_constrained_requests_beside_free_ones(engine, expected):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}  # fmt: skip
    free = PROMPTS[:3]
    results = engine.generate(free, **GREEDY)
    constrained = engine.generate(PROMPTS[3], json_schema=schema, max_new_tokens=24,
                                  temperature=0.0)  # fmt: skip
    assert [r.token_ids for r in results] == [expected[p] for p in free]
    if constrained.finish_reason == "stop":
        assert set(json.loads(constrained.text)) == {"a"}


@pytest.mark.parametrize(
    "rows, vocab",
    [pytest.param(16, 49152, id="smollm-vocab"), pytest.param(3, 5000 + 17, id="ragged-tail"),
     pytest.param(1, 300, id="short-row"), pytest.param(4, 8192, id="exact-chunks")],
)  # fmt: skip
def test_greedy_tokens_equal_argmax(rows, vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(rows, vocab, generator=g)
    # ties: the first occurrence wins, across chunks and against the tail
    logits[0, vocab - 1] = logits[0, 5] = logits[0].max() + 1
    if rows > 1:
        logits[1, :] = float("-inf")
    assert torch.equal(greedy_tokens(logits), logits.argmax(dim=-1))


def test_thread_chooser_switches_only_on_a_trial_confirmed_a_few_steps_later():
    from runtime.models import threads

    chooser = threads.ThreadChooser()
    chooser._average, chooser._period = 1.0, 64
    chooser._judge(1, 0.5)  # wins once: a second trial soon, against fresh steps' average
    assert (chooser.current, chooser.switches, chooser._period) == (0, 0, threads.CONFIRM_AFTER)
    assert chooser._average is None
    chooser._average = 1.0  # the steps in between
    chooser._judge(1, 0.95)  # the confirming trial loses: no switch, the period doubles
    assert (chooser.current, chooser.switches, chooser._period) == (0, 0, 128)
    chooser._judge(1, 0.5)
    chooser._average = 1.0
    chooser._judge(1, 0.6)  # won twice: switched
    assert (chooser.current, chooser.switches) == (1, 1) and chooser._average == 0.6


def test_thread_chooser_tries_the_other_count_and_keeps_tokens(model_dir, expected, monkeypatch):
    from runtime.models import threads

    monkeypatch.setattr(threads, "TRIAL_SHARE", 1.0)  # trials every few steps
    with Engine(model_dir, page_size=4, max_total_tokens=4096) as e:
        chooser = e.runner.chooser
        if chooser is None:
            pytest.skip("torch runs one thread here: nothing to choose")
        chooser._period = 1
        results = e.generate(PROMPTS * 2, **GREEDY)
        assert [r.token_ids for r in results] == [expected[p] for p in PROMPTS * 2]
        assert e.stats()["forward_threads"] in chooser.choices
        assert e.runner.stats().thread_choices == chooser.choices
        with pytest.raises(AttributeError, match="no_such_setting"):  # not set silently
            e.runner.set("no_such_setting", 1)
