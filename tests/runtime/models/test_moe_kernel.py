"""The routed experts of a decode batch in one C call (moe.py's `MoEKernel`, csrc/moe.c): its
routing against `route` (torch), its output bit for bit against the torch path given the same
routing, and within rounding of `moe_forward`'s torch path, for each routing moe.py runs, with
quantized experts of one format or stacked parts of two, shared experts and expert parallel."""

from __future__ import annotations

import pytest
import torch

from runtime.config import MoEConfig
from runtime.kernels.cpu import quant as cpu_quant
from runtime.models.moe import MoEWeights, moe_forward, moe_kernel, route, routed_forward

pytestmark = pytest.mark.skipif(cpu_quant.library() is None, reason="no C compiler")

HIDDEN, INTER = 64, 32

# name -> (MoEConfig arguments after the sizes, shared experts, gate | up in two formats)
ROUTINGS = {
    # Mixtral / Qwen3-MoE: softmax, top-k over all experts, renormalised
    "greedy": (("softmax", "greedy", 1, 1, True, 1.0), 0, True),
    # DeepSeek V2: softmax within the best groups by their best score, scaled, not renormalised
    "group_limited": (("softmax", "group_limited_greedy", 4, 2, False, 16.0), 2, False),
    # DeepSeek V3: sigmoid with the correction bias, groups by their two best, renormalised
    "sigmoid": (("sigmoid", "noaux_tc", 4, 2, True, 2.5), 1, False),
}


def _layer(name: str, experts: range | None = None, seed: int = 0):
    args, shared, stacked = ROUTINGS[name]
    cfg = MoEConfig(8, 2, INTER, shared, 0, *args)
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * 0.1

    def gate_up(rows):
        if stacked:  # Q4_0 gate over Q8_0 up: a QuantStack of two parts
            return torch.cat([cpu_quant.quantize(rand(rows // 2, HIDDEN), "Q4_0"),
                              cpu_quant.quantize(rand(rows // 2, HIDDEN), "Q8_0")])  # fmt: skip
        return cpu_quant.quantize(rand(rows, HIDDEN), "Q8_0")

    held = experts or range(cfg.n_routed_experts)
    gate_ups = [gate_up(2 * INTER) for _ in range(cfg.n_routed_experts)]
    downs = [cpu_quant.quantize(rand(HIDDEN, INTER), "Q4_0") for _ in range(cfg.n_routed_experts)]
    w = MoEWeights(
        router=rand(cfg.n_routed_experts, HIDDEN) * 10,
        score_bias=rand(cfg.n_routed_experts) if args[0] == "sigmoid" else None,
        gate_up=gate_ups[held.start : held.stop],
        down=downs[held.start : held.stop],
        shared_gate_up=gate_up(2 * INTER * shared) if shared else None,
        shared_down=cpu_quant.quantize(rand(HIDDEN, INTER * shared), "Q8_0") if shared else None,
        first_expert=held.start,
    )
    return w, cfg


def _by_id(ids: torch.Tensor, weights: torch.Tensor):
    ids, order = ids.sort(dim=-1)
    return ids, weights.gather(1, order)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_c_experts_equal_the_torch_path(name, dtype):
    w, cfg = _layer(name)
    kernel = moe_kernel(w, cfg)
    assert kernel is not None
    x = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(1)).to(dtype)
    # the routing: the same experts, weights within float32 rounding (another summation order)
    ids, weights = _by_id(*kernel.route(x))
    want_ids, want_weights = _by_id(*route(x, w, cfg))
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-6)
    # with that routing, the experts and their sum are the torch path's bit for bit
    load, want_load = (torch.zeros(cfg.n_routed_experts, dtype=torch.int64) for _ in range(2))
    out = kernel(x, load)
    assert torch.equal(out, routed_forward(x, w, cfg, ids, weights, want_load))
    assert torch.equal(load, want_load) and int(load.sum()) == x.shape[0] * cfg.num_experts_per_tok
    # moe_forward takes the C call for a decode batch; its torch path within rounding
    assert torch.equal(moe_forward(x, w, cfg), out)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 1e-3}
    torch.testing.assert_close(out, moe_forward(x, w, cfg, fast=False), **tol)
    # each row as it is in the batch
    assert torch.equal(kernel(x[4:5].contiguous()), out[4:5])


def test_expert_parallel_rank_and_what_the_c_call_does_not_take():
    name = "sigmoid"
    whole, cfg = _layer(name)
    part, _ = _layer(name, range(2, 6))  # this rank holds experts 2..5 (and the shared ones)
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(2))
    kernel = moe_kernel(part, cfg)
    ids, weights = kernel.route(x)
    assert torch.equal(kernel(x), routed_forward(x, part, cfg, ids, weights))
    # the other experts' contributions: what the ranks' sum adds
    others = kernel(x) - routed_forward(x, whole, cfg, ids, weights)
    assert others.abs().max() > 0
    # dense experts, and prefill-sized batches, take the torch path
    dense = MoEWeights(part.router, part.score_bias,
                       torch.stack([g.dequantize() for g in part.gate_up]),
                       torch.stack([d.dequantize() for d in part.down]), None, None, 2)  # fmt: skip
    assert moe_kernel(dense, cfg) is None
    rows = torch.randn(cpu_quant.DENSE_ROWS, HIDDEN)
    assert torch.equal(moe_forward(rows, part, cfg), moe_forward(rows, part, cfg, fast=False))
    # a batch this large splits the router products over the threads: each row's routing is
    # still the one it gets alone
    many = torch.randn(200, HIDDEN, generator=torch.Generator().manual_seed(3))
    ids, weights = kernel.route(many)
    for r in (0, 77, 199):
        alone = kernel.route(many[r : r + 1].contiguous())
        assert torch.equal(alone[0][0], ids[r]) and torch.equal(alone[1][0], weights[r])
