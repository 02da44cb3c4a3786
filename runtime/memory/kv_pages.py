"""Whole pages of the KV pool as bytes: what a prefill-decode hand-off moves.

A page's wire form is every layer's tensors of the pool layout (`ModelConfig.kv_layout`: K
then V per KV head, or the MLA latent), each `[page_size, heads, dim]`, layer after layer,
concatenated as raw bytes of the pool's dtype. Both sides of a transfer compute the same
`page_bytes` from the same layout, which the protocol checks before any page moves.
"""

from __future__ import annotations

import torch

from runtime.memory.kv_pool import KVPool


def page_bytes(pool: KVPool) -> int:
    """Bytes of one page in wire form: page_size tokens of every layer's KV."""
    return pool.bytes_per_token * pool.page_size


def _tensors(pool: KVPool) -> list[torch.Tensor]:
    """Every `[num_pages, page_size, heads, dim]` tensor of the pool, in wire order."""
    layers = len(next(iter(pool.buffers.values()), []))
    return [pool.buffers[name][layer] for layer in range(layers) for name, _, _ in pool.layout]


def pool_regions(pool: KVPool) -> list[tuple[int, int, int]]:
    """Where every pool tensor lies, in wire order: `(address, bytes per page, bytes)`; page
    `p` of tensor `i` is the `stride` bytes at `address + p * stride` (the tensors are
    contiguous, `[num_pages, page_size, heads, dim]`). Pool-to-pool transfers (Mooncake)
    register these once and address pages through them."""
    out = []
    for t in _tensors(pool):
        if not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError("pool-to-pool transfers need contiguous host-memory pool tensors")
        out.append((t.data_ptr(), t[0].numel() * t.element_size(), t.numel() * t.element_size()))
    return out


def read_pages(pool: KVPool, pages: list[int]) -> torch.Tensor:
    """A copy of `pages` as a `[len(pages), page_bytes]` uint8 tensor (one gather per layer
    tensor); the pool may reuse the pages as soon as this returns."""
    index = torch.tensor(pages, dtype=torch.long)
    parts = [t.index_select(0, index).reshape(len(pages), -1) for t in _tensors(pool)]
    if not parts:
        raise ValueError("this pool holds no KV storage (a parallel engine's driver)")
    data = torch.cat(parts, dim=1).contiguous()
    return data.view(torch.uint8).reshape(len(pages), -1)


def write_pages(pool: KVPool, pages: list[int], data: torch.Tensor) -> None:
    """Store `data` (`[len(pages), page_bytes]` uint8, as `read_pages` makes it) into `pages`."""
    if data.shape != (len(pages), page_bytes(pool)):
        raise ValueError(
            f"KV data of shape {tuple(data.shape)} does not fit {len(pages)} pages of "
            f"{page_bytes(pool)} bytes"
        )
    index = torch.tensor(pages, dtype=torch.long)
    # fp8 pools move as bytes (index_copy_ has no fp8 kernel on CPU): same bytes, uint8 view
    store = torch.uint8 if pool.quantized else pool.dtype
    values = data.contiguous().view(store).reshape(len(pages), -1)
    offset = 0
    for t in _tensors(pool):
        t = t.view(store)
        width = t[0].numel()
        t.index_copy_(0, index, values[:, offset : offset + width].reshape(-1, *t.shape[1:]))
        offset += width
