"""A sliding-window layer whose window no sequence of the step outgrows is full causal attention:
the cpu backend decodes it with the fused kernel (on the window pages' mapped tables, where the
layer keeps its KV there), not through the torch backend's general path; past the window the C
window kernel (kernels/cpu/window.py) reads each query's window. Tokens equal transformers'
either way."""

from __future__ import annotations

import pytest

from runtime import Engine
from runtime.attention import torch_backend
from runtime.attention.cpu_backend import CPUBackend
from tests.support.family_models import expected_tokens, make_family_model
from tests.support.tiny_models import PROMPTS

NEW = 6
GREEDY = dict(max_new_tokens=NEW, min_new_tokens=NEW, temperature=0.0)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """A tiny Gemma 3 whose window (64) holds every prompt and its new tokens."""
    folder = make_family_model(tmp_path_factory.mktemp("gemma3") / "m", "gemma3",
                               sliding_window=64)  # fmt: skip
    return folder, expected_tokens(folder, PROMPTS[:3], NEW)


def _count_general(monkeypatch) -> list[int]:
    """How many decode calls reach the torch backend's general (window) path."""
    calls = [0]
    decode = torch_backend.TorchBackend.decode

    def counted(self, layer, q, spec):
        calls[0] += not spec.plain
        return decode(self, layer, q, spec)

    monkeypatch.setattr(torch_backend.TorchBackend, "decode", counted)
    return calls


def test_a_window_no_sequence_outgrows_takes_the_planned_paths(gemma, monkeypatch):
    folder, expected = gemma
    calls = _count_general(monkeypatch)
    with Engine(str(folder), page_size=4, attention_backend="cpu") as e:
        assert isinstance(e.model.attention, CPUBackend)
        assert any(e.pool.window_layer)  # the window layers keep their KV in pages of their own
        assert all(layer.rope_attend for layer in e.model.layers)  # local layers included
        for p in PROMPTS[:3]:
            assert e.generate(p, **GREEDY).token_ids == expected[p]
        batch = [r.token_ids for r in e.generate(PROMPTS[:3], **GREEDY)]
        assert batch == [expected[p] for p in PROMPTS[:3]]
    assert calls[0] == 0


def test_the_torch_backend_keeps_the_local_and_global_rotary_apart(gemma):
    """Every layer through rope_attend on the torch backend too: a step's cos / sin rows are
    kept per rotary embedding (Gemma's local and global bases), so the tokens are
    transformers'."""
    folder, expected = gemma
    with Engine(str(folder), page_size=4, attention_backend="torch") as e:
        batch = [r.token_ids for r in e.generate(PROMPTS[:3], **GREEDY)]
    assert batch == [expected[p] for p in PROMPTS[:3]]


def test_a_sequence_past_the_window_takes_the_window_kernel(gemma, monkeypatch):
    folder, _ = gemma
    calls = _count_general(monkeypatch)
    long_prompt = " ".join(PROMPTS)  # longer than the window of 64
    expected = expected_tokens(folder, [long_prompt], NEW)[long_prompt]
    with Engine(str(folder), page_size=4, attention_backend="cpu") as e:
        assert len(e.encode(long_prompt)) > 64
        assert e.generate(long_prompt, **GREEDY).token_ids == expected
    assert calls[0] == 0  # decode past the window: the C window kernel, not the general path


def test_the_decode_path_says_why_the_model_is_off_the_decode_chain(gemma, caplog):
    """A dense folder's Gemma decodes layer by layer (the chain runs block-format weights; the
    quantized files' families on it: test_gguf_families.py), and says so at load."""
    folder, _ = gemma
    with caplog.at_level("INFO", logger="runtime.models.decoder"):
        with Engine(str(folder), page_size=4) as e:
            path = e.model.decode_path
    assert path.startswith("per-layer decode, no one-call decode chain")
    assert "integer-kernel block formats" in path
    assert any(path in r.getMessage() for r in caplog.records)  # logged once at load
