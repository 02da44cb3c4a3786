"""The engine on a tiny random Llama gives the same greedy tokens and scores with the Triton
kernels (``SGL_KERNELS=triton``, interpreted on CPU) as with the torch reference: decode and
chunked extend with a cached prefix, through the engine's own page tables.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("SGL_KERNEL_TEST_DEVICE", "cpu") != "cpu":
    pytest.skip(
        "the engine runs on CPU here; this check uses the interpreter", allow_module_level=True
    )
pytest.importorskip("triton", reason="triton is not installed")

PROMPTS = [
    "The quick brown fox jumps over the lazy dog and",
    "Hello",
    "Once upon a time, in a land far away, there lived",
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests._runtime_fixtures import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("kernels") / "tiny-llama")


def _run(model_dir, backend: str, monkeypatch) -> tuple[list[list[int]], list[float]]:
    from runtime import Engine

    monkeypatch.setenv("SGL_KERNELS", backend)
    # chunks of 8 prompt tokens: later chunks extend against a cached prefix
    with Engine(str(model_dir), page_size=4, chunked_prefill_tokens=8) as engine:
        results = engine.generate(PROMPTS, max_new_tokens=10, temperature=0.0)
        scores = engine.score("The capital of France is", [" Paris", " London"])
    return [r.token_ids for r in results], scores


def test_decode_extend_triton_in_engine_matches_torch(tiny_model, monkeypatch):
    tokens_torch, scores_torch = _run(tiny_model, "torch", monkeypatch)
    tokens_triton, scores_triton = _run(tiny_model, "triton", monkeypatch)
    assert tokens_triton == tokens_torch
    assert scores_triton == pytest.approx(scores_torch, abs=1e-4)
