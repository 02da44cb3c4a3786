"""Time the paged-attention kernels: Triton vs the torch reference vs SDPA on gathered K/V.

    PYTHONPATH=. python benchmarks/engine/kernels.py            # CUDA if present, else CPU
    PYTHONPATH=. python benchmarks/engine/kernels.py --device cpu --threads 2

Columns (milliseconds per call, median of timed repeats after warm-up):
  triton      runtime.kernels.triton.attention (CUDA only)
  torch-ref   runtime.kernels.reference (the engine's CPU path)
  sdpa        F.scaled_dot_product_attention on K/V already gathered into contiguous
              [B, Hkv, L, D] tensors: a bound that ignores the cost of paging
  gather+sdpa the same, counting the gather through the page table
  GB/s        K/V bytes read by one decode call / triton time (torch-ref time on CPU)
  err         max |triton - torch-ref| (or |sdpa - torch-ref| on CPU)
One table is printed. On CPU there is no Triton column: triton only compiles for GPUs.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.kernels import reference

try:
    from runtime.kernels.triton import attention as triton_attention
except Exception as exc:  # triton missing or without a backend
    triton_attention = None
    TRITON_ERROR = repr(exc)


@dataclass(slots=True)
class Case:
    kind: str  # "decode" or "extend"
    batch: int
    prefix: int  # cached tokens per request (decode: seq_len - 1)
    extend: int  # new tokens per request (decode: 1)
    q_heads: int
    kv_heads: int
    head_dim: int
    page_size: int

    @property
    def name(self) -> str:
        shape = f"b{self.batch} ctx{self.prefix + self.extend}"
        if self.kind == "extend":
            shape += f" new{self.extend}"
        heads = f"h{self.q_heads}/{self.kv_heads} d{self.head_dim} ps{self.page_size}"
        return f"{self.kind} {shape} {heads}"


def gpu_cases() -> list[Case]:
    llama8b = {"q_heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 16}
    return [
        Case("decode", 1, 4095, 1, **llama8b),
        Case("decode", 16, 2047, 1, **llama8b),
        Case("decode", 64, 4095, 1, **llama8b),
        Case("decode", 64, 1023, 1, q_heads=28, kv_heads=4, head_dim=128, page_size=1),
        Case("extend", 1, 0, 2048, **llama8b),
        Case("extend", 4, 1024, 512, **llama8b),
        Case("extend", 16, 3000, 100, **llama8b),
    ]


def cpu_cases() -> list[Case]:
    smol = {"q_heads": 9, "kv_heads": 3, "head_dim": 64, "page_size": 16}  # SmolLM2-135M
    return [
        Case("decode", 1, 511, 1, **smol),
        Case("decode", 8, 1023, 1, **smol),
        Case("decode", 32, 255, 1, **smol),
        Case("extend", 1, 0, 256, **smol),
        Case("extend", 4, 512, 64, **smol),
    ]


def build(case: Case, dtype: torch.dtype, device: str, seed: int = 0) -> dict:
    """Random pool, shuffled page table, and the same K/V gathered contiguously for SDPA."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    total = case.prefix + case.extend
    pages_per = math.ceil(total / case.page_size)
    num_pages = case.batch * pages_per
    shape = (num_pages, case.page_size, case.kv_heads, case.head_dim)
    k_pool = torch.randn(shape, generator=gen).to(device, dtype)
    v_pool = torch.randn(shape, generator=gen).to(device, dtype)
    table = torch.randperm(num_pages, generator=gen).view(case.batch, pages_per).int().to(device)
    tokens = case.batch * case.extend
    q = torch.randn(tokens, case.q_heads, case.head_dim, generator=gen).to(device, dtype)
    return {"q": q, "k_pool": k_pool, "v_pool": v_pool, "page_table": table, "total": total}


def gather(pool: torch.Tensor, table: torch.Tensor, total: int) -> torch.Tensor:
    """[B, Hkv, total, D] K or V for each request, copied page by page (a strided view)."""
    pages = table[:, : -(-total // pool.shape[1])].long()
    dense = pool.index_select(0, pages.flatten()).view(pages.shape[0], -1, *pool.shape[2:])
    return dense[:, :total].transpose(1, 2)  # [B, Hkv, total, D], strided


def time_ms(fn: Callable[[], object], device: str, budget_s: float = 0.5) -> float:
    """Median wall time of fn in ms, synchronising around each call on CUDA."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < budget_s and len(times) < 200):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_case(case: Case, dtype: torch.dtype, device: str) -> dict:
    d = build(case, dtype, device)
    q, k_pool, v_pool, table, total = d["q"], d["k_pool"], d["v_pool"], d["page_table"], d["total"]
    scale = 1 / math.sqrt(case.head_dim)
    b, e = case.batch, case.extend
    if case.kind == "decode":
        seq_lens = torch.full((b,), total, dtype=torch.int32, device=device)
        args = (q, k_pool, v_pool, table, seq_lens, scale)
        ref = lambda: reference.paged_decode_attention(*args)
        tri = triton_attention and (lambda: triton_attention.paged_decode_attention(*args))
        mask = None  # every request sees its whole (equal-length) sequence
    else:
        prefix_lens = torch.full((b,), case.prefix, dtype=torch.int32, device=device)
        extend_lens = torch.full((b,), e, dtype=torch.int32, device=device)
        args = (q, k_pool, v_pool, table, prefix_lens, extend_lens, scale)
        ref = lambda: reference.paged_extend_attention(*args)
        tri = triton_attention and (lambda: triton_attention.paged_extend_attention(*args))
        q_pos = case.prefix + torch.arange(e, device=device)
        mask = torch.arange(total, device=device)[None, :] <= q_pos[:, None]  # [E, L]

    q_sdpa = q.view(b, e, case.q_heads, case.head_dim).transpose(1, 2)  # [B, Hq, E, D]

    def sdpa(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q_sdpa, k, v, attn_mask=mask, scale=scale, enable_gqa=True
        )

    k_dense = gather(k_pool, table, total).contiguous()
    v_dense = gather(v_pool, table, total).contiguous()
    row: dict = {"case": case.name}
    want = ref()
    row["torch-ref"] = time_ms(ref, device)
    row["sdpa"] = time_ms(lambda: sdpa(k_dense, v_dense), device)
    row["gather+sdpa"] = time_ms(
        lambda: sdpa(gather(k_pool, table, total), gather(v_pool, table, total)), device
    )
    got_sdpa = sdpa(k_dense, v_dense).transpose(1, 2).reshape_as(want)
    row["err"] = (got_sdpa.float() - want.float()).abs().max().item()
    fastest = row["torch-ref"]
    if tri and device == "cuda":
        row["triton"] = time_ms(tri, device)
        row["err"] = (tri().float() - want.float()).abs().max().item()
        fastest = row["triton"]
    if case.kind == "decode":
        kv_bytes = 2 * b * total * case.kv_heads * case.head_dim * k_pool.element_size()
        row["GB/s"] = kv_bytes / (fastest * 1e-3) / 1e9
    return row


def print_table(rows: list[dict], columns: list[str]) -> None:
    def cell(row: dict, col: str) -> str:
        value = row.get(col)
        if value is None:
            return "-"
        if isinstance(value, str):
            return value
        if col == "err":
            return f"{value:.1e}"
        return f"{value:.3f}" if col != "GB/s" else f"{value:.0f}"

    table = [columns] + [[cell(r, c) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for i, line in enumerate(table):
        print("| " + " | ".join(s.ljust(w) for s, w in zip(line, widths, strict=True)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads or device == "cpu":
        # one thread by default on CPU: on a few shared cores, idle torch workers waiting on
        # the scheduler make timings jump in 4 ms steps
        torch.set_num_threads(args.threads or 1)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device == "cuda" else "float32"))
    columns = ["case", "triton", "torch-ref", "sdpa", "gather+sdpa", "GB/s", "err"]
    if device == "cpu":
        print(
            "note: CPU run: Triton kernels compile only for GPUs, so there is no triton column; "
            "GB/s and err use the torch reference (err = |sdpa - torch-ref|)."
        )
        columns.remove("triton")
        print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
        cases = cpu_cases()
    else:
        if triton_attention is None:
            print(f"note: Triton kernels unavailable ({TRITON_ERROR}); torch columns only")
            columns.remove("triton")
        print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
        cases = gpu_cases()
    print(f"dtype {dtype}, times in ms (median)")
    rows = [run_case(case, dtype, device) for case in cases]
    print_table(rows, columns)


if __name__ == "__main__":
    sys.exit(main())
