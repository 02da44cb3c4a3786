"""The KV pool's storage is reserved, not resident: every value reads 0 until written (as
`torch.zeros`), and only the memory pages that are written are held by the system."""

from __future__ import annotations

from pathlib import Path

import torch

from runtime.config import config_from_dict
from runtime.memory.kv_pool import KVPool, zeroed

# 4 layers x K, V of 4 heads x 64 dims in fp32: 1 KiB a token a tensor; 1,024 pages of 16 tokens
# = 128 MiB of storage in all (16 MiB a tensor)
CONFIG = config_from_dict(
    {"model_type": "llama", "vocab_size": 100, "hidden_size": 256, "intermediate_size": 512,
     "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4}
)  # fmt: skip
PAGES, PAGE = 1024, 16


def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def _write_pages(pool: KVPool, pages: list[int], value: float) -> None:
    slots = torch.tensor([p * PAGE + i for p in pages for i in range(PAGE)])
    values = torch.full((len(slots), 4, 64), value)
    for layer in range(CONFIG.num_layers):
        pool.write("k", layer, slots, values)
        pool.write("v", layer, slots, -values)


def test_a_fresh_pool_reserves_its_storage_without_holding_it():
    before = _rss_anon()
    pool = KVPool(CONFIG, PAGES, PAGE, torch.float32)
    grown = _rss_anon() - before
    reserved = pool.reserved_bytes()
    assert reserved == 2 * 4 * PAGES * PAGE * 4 * 64 * 4 == 128 * 2**20
    assert pool.resident_bytes() == 0
    assert grown < reserved // 8  # 128 MiB reserved: the process grew by far less


def test_written_pages_become_resident_and_unwritten_ones_read_zero():
    pool = KVPool(CONFIG, PAGES, PAGE, torch.float32)
    pages = pool.alloc(3)
    assert pages == [3, 2, 1]  # the lowest ids first
    _write_pages(pool, pages, 1.5)
    page_bytes = PAGE * 4 * 64 * 4  # 16 KiB of each tensor
    # 3 pages (48 KiB) of each of the 8 tensors, nothing else (a system that backs
    # anonymous memory with 2 MiB pages unasked holds the 2 MiB around them)
    assert 8 * 3 * page_bytes <= pool.resident_bytes() <= 8 * max(3 * page_bytes, 2**21)
    for layer in range(CONFIG.num_layers):
        assert torch.equal(pool.k[layer][1:4], torch.full((3, PAGE, 4, 64), 1.5))
        assert torch.equal(pool.v[layer][1:4], torch.full((3, PAGE, 4, 64), -1.5))
        # never-written pages read 0 (page 0, the pages next to the written ones, the last)
        for page in (0, 4, 5, PAGES - 1):
            assert not pool.k[layer][page].any() and not pool.v[layer][page].any()


def test_freed_pages_are_handed_out_again_before_untouched_ones():
    pool = KVPool(CONFIG, PAGES, PAGE, torch.float32)
    first = pool.alloc(5)
    _write_pages(pool, first, 2.0)
    held = pool.resident_bytes()
    pool.free(first)
    again = pool.alloc(5)
    assert sorted(again) == sorted(first)
    _write_pages(pool, again, 3.0)
    assert pool.resident_bytes() == held
    assert torch.equal(pool.k[0][again[0]], torch.full((PAGE, 4, 64), 3.0))


def test_zeroed_is_torch_zeros_for_every_storage_type():
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        big = zeroed((64, 16, 8, 128), dtype, torch.device("cpu"))  # >= 1 MiB: a mapping
        small = zeroed((2, 16, 8, 128), dtype, torch.device("cpu"))  # below: torch.zeros
        for t in (big, small):
            assert t.dtype == dtype and t.is_contiguous()
            assert not t.view(torch.uint8).any()


def test_a_pool_larger_than_the_machine_is_refused_at_start(monkeypatch):
    """Its pages would become resident only as they fill: without the check, a pool the
    machine cannot hold would start and fail later, under load."""
    import runtime.memory.kv_pool as kv_pool
    from runtime.errors import KVPoolTooLargeError

    monkeypatch.setattr(kv_pool, "available_memory_bytes", lambda: 127 * 2**20)
    try:
        KVPool(CONFIG, PAGES, PAGE, torch.float32)
    except KVPoolTooLargeError as exc:
        assert "0.12 GiB available" in str(exc) and "--mem-budget-gb" in str(exc)
    else:
        raise AssertionError("a 128 MiB pool was reserved with 127 MiB available")
    monkeypatch.setattr(kv_pool, "available_memory_bytes", lambda: 129 * 2**20)
    assert KVPool(CONFIG, PAGES, PAGE, torch.float32).reserved_bytes() == 128 * 2**20
