"""Mixture-of-experts for DeepSeek V2 / V3, Qwen3-MoE and Mixtral: the router and the experts of
one layer.

Routing follows `transformers`' DeepSeek routers exactly. V2: softmax scores, top-k over all
experts (`greedy`) or within the `topk_group` groups holding the highest single score
(`group_limited_greedy`). V3: sigmoid scores; the choice adds `e_score_correction_bias` and is
limited to the `topk_group` groups whose two best biased scores sum highest; the weights are
the unbiased scores, renormalised when `norm_topk_prob`. Both scale by `routed_scaling_factor`.
Qwen3-MoE and Mixtral route as V2's `greedy` and renormalise the top-k weights (Mixtral always,
Qwen3-MoE when `norm_topk_prob`).

Experts run grouped: the step's (token, expert) pairs are sorted by expert, and each expert
that received tokens runs once over all of them (two matmuls), never once per token. Shared
experts are one dense MLP over every token. Experts in a GGUF block format stay in it (one
`QuantTensor` per expert: a list instead of a stacked tensor) and multiply through the quantized
kernels, the SwiGLU inside the down product's input stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.config import MoEConfig
from runtime.kernels.cpu import quant as cpu_quant
from runtime.models.layers import dense_weight, nbytes


@dataclass(slots=True)
class MoEWeights:
    router: torch.Tensor  # [E, hidden] float32
    score_bias: torch.Tensor | None  # [E] float32 (V3's e_score_correction_bias)
    gate_up: torch.Tensor | list  # [E, 2 I, hidden] (a list of E quantized weights)
    down: torch.Tensor | list  # [E, hidden, I]
    shared_gate_up: torch.Tensor | None  # [2 I_shared, hidden]
    shared_down: torch.Tensor | None  # [hidden, I_shared]
    first_expert: int = 0  # gate_up / down hold experts first_expert .. + len (expert parallel)

    def tensors(self) -> list[torch.Tensor]:
        out = [t for t in (self.router, self.score_bias, self.shared_gate_up, self.shared_down)
               if t is not None]  # fmt: skip
        for experts in (self.gate_up, self.down):
            out += experts if isinstance(experts, list) else [experts]
        return out

    def expert_bytes(self) -> int:
        """Bytes of the routed experts held (quantized ones as stored)."""
        return sum(nbytes(t) for e in (self.gate_up, self.down)
                   for t in (e if isinstance(e, list) else [e]))  # fmt: skip


def _expert_mlp(x: torch.Tensor, gate_up, down) -> torch.Tensor:
    """`down(silu(gate) * up)` of one expert (quantized weights: through the quantized kernels)."""
    if cpu_quant.is_quantized(gate_up):
        h = cpu_quant.linear(x, gate_up)
    else:
        h = F.linear(x, gate_up)
    if cpu_quant.is_quantized(down):
        return cpu_quant.linear(h, down, swiglu=True)
    gate, up = h.chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def route(x: torch.Tensor, w: MoEWeights, cfg: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T, k] int64, weights [T, k] float32) for tokens x [T, hidden]."""
    logits = F.linear(x.float(), w.router)
    t, e = logits.shape
    if cfg.scoring == "sigmoid":
        scores = logits.sigmoid()
        choice = scores + w.score_bias if w.score_bias is not None else scores
        group_rank = choice.view(t, cfg.n_group, e // cfg.n_group).topk(2, dim=-1)[0].sum(-1)
        choice = _keep_groups(choice, group_rank, cfg, float("-inf"))
        ids = choice.topk(cfg.num_experts_per_tok, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    else:
        scores = logits.softmax(dim=-1, dtype=torch.float32)
        if cfg.topk_method == "group_limited_greedy":
            group_rank = scores.view(t, cfg.n_group, e // cfg.n_group).max(dim=-1).values
            scores = _keep_groups(scores, group_rank, cfg, 0.0)
        weights, ids = scores.topk(cfg.num_experts_per_tok, dim=-1, sorted=False)
        if cfg.norm_topk_prob:  # Mixtral always, Qwen3-MoE when configured (V2 never)
            weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights * cfg.routed_scaling_factor


def _keep_groups(scores: torch.Tensor, group_rank: torch.Tensor, cfg: MoEConfig, fill: float):
    """`scores` with every expert outside the `topk_group` best groups set to `fill`."""
    t, e = scores.shape
    best = group_rank.topk(cfg.topk_group, dim=-1, sorted=False)[1]
    keep = torch.zeros_like(group_rank, dtype=torch.bool).scatter_(1, best, True)
    keep = keep.unsqueeze(-1).expand(t, cfg.n_group, e // cfg.n_group).reshape(t, e)
    return scores.masked_fill(~keep, fill)


def moe_forward(
    x: torch.Tensor, w: MoEWeights, cfg: MoEConfig, load: torch.Tensor | None = None
) -> torch.Tensor:
    """Routed experts (grouped by expert) plus shared experts; adds this step's tokens per
    expert to `load` [E] when given."""
    ids, weights = route(x, w, cfg)
    out = torch.zeros_like(x)
    flat = ids.flatten()
    counts = torch.bincount(flat, minlength=cfg.n_routed_experts)
    if load is not None:
        load += counts
    order = torch.argsort(flat, stable=True)
    tokens = order // cfg.num_experts_per_tok  # the token of each (token, expert) pair
    pair_weights = weights.flatten()[order]
    start = 0
    held = range(w.first_expert, w.first_expert + len(w.gate_up))
    for expert, n in enumerate(counts.tolist()):
        if n and expert in held:  # expert parallel: other ranks run the others
            rows = tokens[start : start + n]
            local = expert - w.first_expert
            y = _expert_mlp(x[rows], w.gate_up[local], w.down[local])
            out.index_add_(0, rows, (y * pair_weights[start : start + n, None]).to(out.dtype))
        start += n
    if w.shared_gate_up is not None:
        out = out + _expert_mlp(x, w.shared_gate_up, w.shared_down)
    return out


def load_moe(
    take, maybe, prefix: str, cfg: MoEConfig, experts: range | None = None, shared: bool = True
) -> MoEWeights:
    """A layer's MoE weights from per-expert checkpoint keys (`experts.{e}.gate_proj.weight`,
    what `save_pretrained` writes) or fused ones (`experts.gate_up_proj`, `experts.down_proj`):
    the routed `experts` (default all) and, if `shared`, the shared experts. Quantized experts
    (a GGUF's) stay a list of per-expert weights; the router is dequantized (it runs in
    float32)."""
    experts = range(cfg.n_routed_experts) if experts is None else experts
    fused = maybe(prefix + "experts.gate_up_proj")
    if fused is not None:
        gate_up = fused[experts.start : experts.stop]
        down = take(prefix + "experts.down_proj")[experts.start : experts.stop]
    else:
        gate_up = [
            torch.cat([take(f"{prefix}experts.{e}.gate_proj.weight"),
                       take(f"{prefix}experts.{e}.up_proj.weight")])
            for e in experts
        ]  # fmt: skip
        down = [take(f"{prefix}experts.{e}.down_proj.weight") for e in experts]
        if not any(cpu_quant.is_quantized(t) for t in gate_up + down):
            gate_up, down = torch.stack(gate_up), torch.stack(down)
    shared_gate_up = shared_down = None
    if cfg.n_shared_experts and shared:
        s = prefix + "shared_experts."
        shared_gate_up = torch.cat([take(s + "gate_proj.weight"), take(s + "up_proj.weight")])
        shared_down = take(s + "down_proj.weight")
    return MoEWeights(
        router=dense_weight(take(prefix + "gate.weight", torch.float32)),  # routing: float32
        score_bias=maybe(prefix + "gate.e_score_correction_bias", torch.float32),
        gate_up=gate_up if isinstance(gate_up, list) else gate_up.contiguous(),
        down=down if isinstance(down, list) else down.contiguous(),
        shared_gate_up=shared_gate_up,
        shared_down=shared_down,
        first_expert=experts.start,
    )
