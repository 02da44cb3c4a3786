"""MLA's decode attention in C (runtime/kernels/cpu/csrc/mla.c `q_mla_decode`, called by
runtime/models/mla.py for decode-only steps) against the same steps in torch: the latent's
RMSNorm, the rope part's rotary (interleaved or rotate-half), the latent written at the slots,
the query absorbed through W_uk, the reference paged latent attention, W_uv. Three requests of
different lengths on scattered pages, long enough that the heads split over the kernel's
thread pool (the same bits on one thread and on two)."""

from __future__ import annotations

import ctypes

import pytest
import torch

from runtime.kernels import reference
from runtime.kernels.cpu import quant as cpu_quant
from runtime.models import mla
from runtime.models.layers import rms_norm
from runtime.models.rope import apply_rotary, apply_rotary_interleaved

H, R, DR, NOPE, V, PS, EPS, SCALE = 6, 64, 16, 32, 32, 16, 1e-6, 0.125
LENS = [2200, 37, 300]  # H x 2537 x (R + DR) multiply-adds: over the pool split (1M)

lib = cpu_quant.library()
pytestmark = pytest.mark.skipif(lib is None, reason="no C compiler: the torch ops only")


def _case(dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(0)
    n, per = len(LENS), max(LENS) // PS + 1

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    perm = torch.randperm(n * per, generator=g).to(torch.int32) + 1  # scattered pages
    table = perm.view(n, per).contiguous()
    last = [length - 1 for length in LENS]
    slots = torch.tensor([int(table[b, p // PS]) * PS + p % PS for b, p in enumerate(last)])
    return dict(pages=rand(n * per + 1, PS, 1, R + DR), table=table, slots=slots,
                lens=torch.tensor(LENS, dtype=torch.int32), q=rand(n, H * (NOPE + DR)),
                kv=rand(n, R + DR), cos=rand(n, DR), sin=rand(n, DR), kv_norm=rand(R),
                w_uk=rand(H, NOPE, R) * 0.2, w_uv=rand(H, V, R) * 0.2)  # fmt: skip


def _c(case: dict, interleave: bool, threads: int) -> tuple[torch.Tensor, torch.Tensor]:
    pages, dtype = case["pages"].clone(), case["q"].dtype
    out = torch.empty(len(LENS), H * V, dtype=dtype)
    step = mla._Step(len(LENS), None, case["slots"].data_ptr(), case["table"].data_ptr(),
                     case["table"].shape[1], case["lens"].data_ptr(), PS, pages.shape[0],
                     case["cos"].data_ptr(), case["sin"].data_ptr())  # fmt: skip
    layer = mla._Layer(H, NOPE, DR, V, R, int(interleave), EPS, SCALE,
                       case["kv_norm"].data_ptr(), case["w_uk"].data_ptr(),
                       case["w_uv"].data_ptr(), pages.data_ptr())  # fmt: skip
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # the kernel's OpenMP thread count (the same libgomp)
    try:
        rc = lib.q_mla_decode(ctypes.byref(layer), ctypes.byref(step), case["q"].data_ptr(),
                              case["q"].shape[1], case["kv"].data_ptr(), case["kv"].shape[1],
                              out.data_ptr(), int(dtype == torch.bfloat16))  # fmt: skip
    finally:
        torch.set_num_threads(before)
    assert rc == 0
    return out, pages


def _torch(case: dict, interleave: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rotate = apply_rotary_interleaved if interleave else apply_rotary
    pages, n = case["pages"].clone(), len(LENS)
    cos, sin = case["cos"][:, None], case["sin"][:, None]
    c = rms_norm(case["kv"][:, :R], case["kv_norm"], EPS)
    k_rope = rotate(case["kv"][:, None, R:], cos, sin)[:, 0]
    pages.view(-1, R + DR)[case["slots"]] = torch.cat((c, k_rope), dim=-1)
    q = case["q"].view(n, H, NOPE + DR)
    q_lat = torch.einsum("thn,hnr->thr", q[..., :NOPE].float(), case["w_uk"].float())
    q_full = torch.cat((q_lat, rotate(q[..., NOPE:], cos, sin).float()), dim=-1)
    latent = reference.paged_latent_decode_attention(
        q_full, pages.float(), case["table"], case["lens"], SCALE, R
    )
    out = torch.einsum("thr,hvr->thv", latent.float(), case["w_uv"].float())
    return out.reshape(n, H * V), pages


@pytest.mark.parametrize("interleave", [True, False], ids=["interleaved", "rotate-half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_c_decode_attention_matches_torch_and_splits_to_the_same_bits(dtype, interleave):
    case = _case(dtype)
    out, pages = _c(case, interleave, threads=1)
    split, split_pages = _c(case, interleave, threads=2)
    assert torch.equal(out, split) and torch.equal(pages, split_pages)
    ref, ref_pages = _torch(case, interleave)
    # the latents written: fp32 the same values to rounding; bf16 one rounding apart at most
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(pages.float(), ref_pages.float(), atol=tol, rtol=tol)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), ref, atol=tol * ref.abs().max(), rtol=0)
