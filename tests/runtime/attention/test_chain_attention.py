"""The one-call decode chain's attention is the cpu backend's (`chain_attention`): for a
decode-only step it hands the chain the fused decode step of the layers on the full rotary and
the step's page table, and one step of their own for layers with other rotary tables, window
pages and a window (shared between such layers); the step's pages are counted on the pool the
layer reads (a global layer's, not the smaller window pool); other steps and other backends do
not serve it."""

from __future__ import annotations

import ctypes
import dataclasses

import pytest
import torch

from runtime.attention.cpu_backend import CPUBackend
from runtime.attention.forward_batch import ForwardBatch
from runtime.attention.torch_backend import TorchBackend
from runtime.config import FULL, SLIDING, ModelConfig
from runtime.kernels.cpu import fused as cpu_fused
from runtime.memory.kv_pool import KVPool
from runtime.models.rope import RotaryEmbedding
from tests.support.forward_batches import mixed_batch

pytestmark = pytest.mark.skipif(not cpu_fused.available(torch.float32), reason="no C compiler")
WINDOW, PAGES, WINDOW_PAGES, PS = 8, 40, 9, 4

CONFIG = ModelConfig(
    model_type="gemma3_text", architecture="Gemma3ForCausalLM", vocab_size=32, hidden_size=64,
    intermediate_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
    rms_norm_eps=1e-6, max_position_embeddings=256, rope_theta=1_000_000.0,
    sliding_window=WINDOW, layer_types=(SLIDING, FULL, SLIDING),
)  # fmt: skip


def _decode_step() -> ForwardBatch:
    """Two requests decoding at 30 and 13 tokens, on pages past the window pool's count."""
    table = torch.tensor([[31, 32, 33, 34, 35, 36, 37, 38], [20, 21, 22, 23, 0, 0, 0, 0]],
                         dtype=torch.int32)  # fmt: skip
    lens = torch.tensor([30, 13], dtype=torch.int32)
    pos = (lens - 1).long()
    slots = torch.stack([table[i, p // PS].long() * PS + p % PS for i, p in enumerate(pos)])
    none = torch.zeros(0, dtype=torch.int32)
    return ForwardBatch(torch.tensor([3, 4]), pos, slots, 2, table, lens, table[:0], none, none,
                        torch.arange(2))  # fmt: skip


def _layers():
    full = RotaryEmbedding(CONFIG, torch.float32)
    local = RotaryEmbedding(dataclasses.replace(CONFIG, rope_theta=10_000.0), torch.float32)
    return full, [(local, WINDOW, None), (full, None, None), (local, WINDOW, None)]


def test_the_cpu_backend_hands_the_chain_its_decode_attention():
    pool = KVPool(CONFIG, PAGES, PS, torch.float32, window_pages=WINDOW_PAGES)
    assert pool.window_layer == [True, False, True]
    backend = CPUBackend()
    backend.plan(_decode_step(), pool)
    full, layers = _layers()
    served = backend.chain_attention(full, layers, CONFIG.num_heads, torch.float32)
    assert served is not None
    rope, steps = served
    assert steps[1] is None  # the global layer: the shared step
    assert steps[0] is steps[2] and steps[0] is not None  # one step for both local layers
    assert rope.args.num_pages == PAGES  # counted on the global pool, not layer 0's window pool
    assert steps[0].args.num_pages == WINDOW_PAGES and steps[0].args.window == WINDOW
    assert rope.args.window == 0
    # every layer on the full rotary and the step's pages: no per-layer steps at all
    plain = KVPool(CONFIG, PAGES, PS, torch.float32)
    backend.plan(_decode_step(), plain)
    rope, steps = backend.chain_attention(full, [(full, None, None)] * 3, 4, torch.float32)
    assert steps is None and rope.args.num_pages == PAGES


def test_other_steps_and_backends_do_not_serve_it():
    pool = KVPool(CONFIG, PAGES, PS, torch.float32)
    full, layers = _layers()
    cpu = CPUBackend()
    cpu.plan(mixed_batch(), pool)  # an extend in the step
    assert cpu.chain_attention(full, layers, 4, torch.float32) is None
    torch_backend = TorchBackend()
    torch_backend.plan(_decode_step(), pool)
    assert torch_backend.chain_attention(full, layers, 4, torch.float32) is None
    off = CPUBackend(fused=False)
    off.plan(_decode_step(), pool)
    assert off.chain_attention(full, layers, 4, torch.float32) is None


def test_a_latent_pool_gets_the_step_rows_for_its_hooks():
    """MLA (a pool of latents, no K / V): no shared step; every layer gets the step's rows
    (positions, slots, page table, lengths) as rope_decode's argument struct."""
    from runtime.config import MLAConfig
    from runtime.kernels.cpu.fused import _RopeStepArgs

    mla = MLAConfig(q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                    v_head_dim=8)  # fmt: skip
    config = dataclasses.replace(CONFIG, layer_types=(FULL,) * 3, sliding_window=None, mla=mla)
    pool = KVPool(config, PAGES, PS, torch.float32)
    assert not pool.k and len(pool.latent) == 3
    backend = CPUBackend()
    step = _decode_step()
    backend.plan(step, pool)
    full, _ = _layers()
    served = backend.chain_attention(full, [(full, None, None)] * 3, 4, torch.float32)
    assert served is not None and served[0] is None
    steps = served[1]
    assert len(steps) == 3 and steps[0] is steps[2]
    fn, address = steps[0].c_call()
    args = _RopeStepArgs.from_address(address)
    assert fn == 0 and args.n == 2 and args.ps == PS and args.num_pages == PAGES
    cos, sin = full.tables(step.positions)
    assert (args.cos, args.sin, args.rot) == (cos.data_ptr(), sin.data_ptr(), full.dim)
    n = 2
    pos = (ctypes.c_int64 * n).from_address(args.pos)
    slots = (ctypes.c_int64 * n).from_address(args.slots)
    lens = (ctypes.c_int32 * n).from_address(args.lens)
    assert list(pos) == step.positions.tolist() and list(slots) == step.out_slots.tolist()
    assert list(lens) == step.decode_seq_lens.tolist()
    table = (ctypes.c_int32 * (n * args.table_stride)).from_address(args.table)
    assert list(table)[: step.decode_page_table.shape[1]] == step.decode_page_table[0].tolist()
    mixed = mixed_batch()
    backend.plan(mixed, pool)
    assert backend.chain_attention(full, [(full, None, None)] * 3, 4, torch.float32) is None
    backend.plan(step, KVPool(config, PAGES, PS, torch.bfloat16))
    assert backend.chain_attention(full, [(full, None, None)] * 3, 4, torch.float32) is None
