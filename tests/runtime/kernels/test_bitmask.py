"""apply_token_bitmask_: the torch reference and the Triton kernel against a numpy unpacking.

Exact comparison (masking only writes -inf; allowed logits are untouched bit for bit).
On CPU the Triton kernel runs in Triton's interpreter (tests/support/triton_kernels.py);
``SGL_KERNEL_TEST_DEVICE=cuda`` runs it compiled.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.kernels import reference
from tests.support.triton_kernels import DEVICE, triton_kernels

# interpreted on CPU (TRITON_INTERPRET=1 for the whole session: tests/conftest.py)
triton_bitmask, TRITON_ERROR = triton_kernels("triton.bitmask")

if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("SGL_KERNEL_TEST_DEVICE=cuda but CUDA is not available", allow_module_level=True)

BACKENDS = [
    pytest.param("torch", id="torch"),
    pytest.param(
        "triton",
        id="triton",
        marks=pytest.mark.skipif(triton_bitmask is None, reason=TRITON_ERROR or ""),
    ),
]


def _apply(backend: str):
    module = reference if backend == "torch" else triton_bitmask
    return module.apply_token_bitmask_


def numpy_allowed(bitmask: np.ndarray, vocab: int) -> np.ndarray:
    """[R, W] int32 words -> [R, vocab] bool; little-endian bits, tokens >= 32*W disallowed."""
    words = np.ascontiguousarray(bitmask.astype("<i4"))
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little").astype(bool)
    out = np.zeros((bitmask.shape[0], vocab), dtype=bool)
    width = min(vocab, bits.shape[1])
    out[:, :width] = bits[:, :width]
    return out


def expected_logits(logits: torch.Tensor, bitmask: torch.Tensor, rows) -> np.ndarray:
    want = logits.float().cpu().numpy().copy()
    allowed = numpy_allowed(bitmask.cpu().numpy(), logits.shape[1])
    rows = range(bitmask.shape[0]) if rows is None else rows
    for i, row in enumerate(rows):
        want[row, ~allowed[i]] = -np.inf
    return want


def random_bitmask(rows: int, words: int, seed: int, density: float = 0.5) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    bits = rng.random((rows, words * 32)) < density
    packed = np.packbits(bits, axis=1, bitorder="little").view("<i4")
    return torch.from_numpy(packed.astype(np.int32))


# (batch, vocab, mask words, row indices or None, logits dtype)
CASES = [
    pytest.param(4, 64, 2, None, torch.float32, id="vocab-multiple-of-32"),
    pytest.param(3, 1000, 32, None, torch.float32, id="vocab-not-multiple-of-32"),
    pytest.param(2, 1000, 20, None, torch.float32, id="tokens-past-mask-disallowed"),
    pytest.param(6, 300, 10, [5, 0, 3], torch.float32, id="row-indices-subset"),
    pytest.param(5, 257, 9, [4, 3, 2, 1, 0], torch.float32, id="row-indices-reversed"),
    pytest.param(4, 96, 3, None, torch.float16, id="fp16-logits"),
    pytest.param(3, 2500, 79, [2, 0], torch.bfloat16, id="bf16-logits-row-indices"),
    pytest.param(1, 33000, 1032, None, torch.float32, id="large-vocab-several-blocks"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,vocab,words,rows,dtype", CASES)
def test_bitmask_matches_numpy(backend, batch, vocab, words, rows, dtype):
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(vocab))
    logits = logits.to(DEVICE, dtype)
    n_rows = batch if rows is None else len(rows)
    bitmask = random_bitmask(n_rows, words, seed=words).to(DEVICE)
    want = expected_logits(logits, bitmask, rows)
    row_indices = None if rows is None else torch.tensor(rows, dtype=torch.int32, device=DEVICE)
    out = _apply(backend)(logits, bitmask, row_indices)
    assert out is logits  # in place
    np.testing.assert_array_equal(logits.float().cpu().numpy(), want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bitmask_sign_bit_allows_token_31(backend):
    logits = torch.zeros(1, 64, device=DEVICE)
    # word 0: only bit 31 (the int32 sign bit); word 1: only bit 0
    bitmask = torch.tensor([[-(2**31), 1]], dtype=torch.int32, device=DEVICE)
    _apply(backend)(logits, bitmask)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed == [31, 32]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bitmask_all_ones_leaves_logits_untouched(backend):
    logits = torch.randn(3, 100, device=DEVICE)
    before = logits.clone()
    _apply(backend)(logits, torch.full((3, 4), -1, dtype=torch.int32, device=DEVICE))
    assert torch.equal(logits, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bitmask_all_zeros_masks_everything(backend):
    logits = torch.randn(2, 70, device=DEVICE)
    _apply(backend)(logits, torch.zeros(2, 3, dtype=torch.int32, device=DEVICE))
    assert torch.isneginf(logits).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bitmask_unlisted_rows_untouched(backend):
    logits = torch.randn(4, 50, device=DEVICE)
    before = logits.clone()
    rows = torch.tensor([2], dtype=torch.int32, device=DEVICE)
    _apply(backend)(logits, torch.zeros(1, 2, dtype=torch.int32, device=DEVICE), rows)
    assert torch.isneginf(logits[2]).all()
    keep = [0, 1, 3]
    assert torch.equal(logits[keep], before[keep])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bitmask_empty_row_indices_is_noop(backend):
    logits = torch.randn(2, 40, device=DEVICE)
    before = logits.clone()
    empty = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    _apply(backend)(logits, torch.zeros(0, 2, dtype=torch.int32, device=DEVICE), empty)
    assert torch.equal(logits, before)


def test_bitmask_dispatch_forced_torch(monkeypatch):
    from runtime import kernels

    monkeypatch.setenv("SGL_KERNELS", "torch")
    logits = torch.zeros(1, 32, device=DEVICE)
    kernels.apply_token_bitmask_(logits, torch.tensor([[1]], dtype=torch.int32, device=DEVICE))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0]
