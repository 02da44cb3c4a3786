"""The server's speculative flags reach the Engine in SGLang's and vLLM's terms; /metrics and
SGLang's meta_info carry the numbers."""

from __future__ import annotations

import pytest

from runtime import Engine
from runtime.server.__main__ import engine_kwargs, parse_args
from runtime.server.metrics import ServerMetrics
from runtime.server.native_api import _meta
from runtime.speculative.config import SpeculativeConfigError


def _spec_kwargs(argv):
    return {k: v for k, v in engine_kwargs(parse_args(argv)).items() if "speculative" in k}


def test_flags_become_engine_keywords():
    kw = _spec_kwargs(["--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "5",
                       "--speculative-ngram-max-match-window-size", "6"])  # fmt: skip
    assert kw["speculative_algorithm"] == "NGRAM"
    assert kw["speculative_num_draft_tokens"] == 5
    assert kw["speculative_ngram_max_match_window_size"] == 6
    assert _spec_kwargs([])["speculative_algorithm"] is None


def test_speculation_through_the_server_options(model_dir):
    argv = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
    with Engine(str(model_dir), max_total_tokens=1024, **_spec_kwargs(argv)) as engine:
        assert engine.speculative.num_draft_tokens == 3
        out = engine.generate("1, 2, 3, 1, 2, 3, 1, 2", max_new_tokens=24, temperature=0.0,
                              ignore_eos=True)  # fmt: skip
        stats = engine.stats()
    assert stats["speculative_algorithm"] == "NGRAM" and stats["spec_verify_steps"] > 0
    text = ServerMetrics().render(stats, 0)
    assert "spec_accept_length" in text and "spec_verify_steps_total" in text
    opts = {"rid": "x", "top_n": 0, "sglang_shape": True, "with_text": False}
    meta = _meta(out, opts, engine.tokenizer)
    assert meta["spec_verify_ct"] == out.usage.spec_verify_ct > 0
    assert meta["spec_accept_length"] >= 1.0


def test_bad_server_options_are_refused_by_name(model_dir):
    argv = ["--speculative-config", '{"method": "ngram", "n_tokens": 3}']
    with pytest.raises(SpeculativeConfigError, match="n_tokens"):
        Engine(str(model_dir), max_total_tokens=1024, **_spec_kwargs(argv))
    with pytest.raises(SystemExit):
        parse_args(["--speculative-algorithm", "MEDUSA"])


def test_draft_model_through_the_server_flags(model_dir):
    argv = ["--speculative-algorithm", "standalone", "--speculative-draft-model-path",
            str(model_dir), "--speculative-num-draft-tokens", "3"]  # fmt: skip
    with Engine(str(model_dir), max_total_tokens=1024, **_spec_kwargs(argv)) as engine:
        assert engine.speculative.algorithm == "STANDALONE"
        assert engine.scheduler.speculation.draft is not None
        out = engine.generate("The quick brown fox", max_new_tokens=16, temperature=0.0,
                              ignore_eos=True)  # fmt: skip
        assert len(out.token_ids) == 16
    with pytest.raises(SpeculativeConfigError, match="speculative_draft_model_path"):
        Engine(str(model_dir), max_total_tokens=1024,
               **_spec_kwargs(["--speculative-algorithm", "STANDALONE"]))  # fmt: skip
