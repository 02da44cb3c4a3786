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

A decode batch (fewer than `cpu_quant.DENSE_ROWS` rows) of a layer whose experts are all in
integer-kernel block formats runs in one C call instead (csrc/moe.c's `q_moe`, `MoEKernel`):
routing, the grouped experts in the same order with the same kernels, the shared experts. The
decode chain calls the same function as a layer's MLP half. Its outputs are `moe_forward`'s torch
path's bit for bit for the same routing; the router product and softmax are summed in another
order than torch's, so a weight may differ in its last bits (and a near tie pick another expert).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from runtime.config import MoEConfig
from runtime.kernels.cpu import quant as cpu_quant
from runtime.kernels.cpu.quant_chain import ChainHook
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
    # the C call's arguments (`MoEKernel`), built at the first decode batch (False: not served)
    kernel: object = field(default=None, repr=False)

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


_I64, _F32, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p


_Proj = cpu_quant.QProj  # csrc/moe.h's moe_proj: q_matmul's leading arguments


class _Mat(ctypes.Structure):  # moe_mat: up to three parts stacked by rows
    _fields_ = [("part", _Proj * 3), ("row", _I64)]


class _MoE(ctypes.Structure):  # q_moe
    _fields_ = [(name, _I64) for name in ("experts", "k", "hidden", "inter", "first", "held",
                                          "sigmoid", "group_limited", "n_group", "topk_group",
                                          "norm_topk")] + [
        ("scale", _F32), ("router", _PTR), ("bias", _PTR), ("gate_up", _PTR), ("down", _PTR),
        ("shared_gate_up", _Mat), ("shared_down", _Proj), ("load", _PTR),
    ]  # fmt: skip


def _mat(w) -> _Mat:
    mat = _Mat(row=w.shape[0])
    for k, p in enumerate(cpu_quant.parts(w)):
        mat.part[k] = cpu_quant.q_proj(p)
    return mat


def _c_weight(w, rows: int, cols: int, stack: bool) -> bool:
    """Whether `w` is a [rows, cols] weight the C experts multiply: integer-kernel block formats,
    one tensor (or, with `stack`, up to three stacked parts)."""
    parts = cpu_quant.parts(w) if stack else [w]
    return len(parts) <= 3 and tuple(w.shape) == (rows, cols) and all(
        cpu_quant.int_kernel(p) for p in parts
    )  # fmt: skip


class MoEKernel:
    """One layer's routed (and shared) experts as csrc/moe.c's `q_moe` arguments: the C call
    for a decode batch. Holds the tensors it points at; the weights are packed once here.

    Invariant: the weights are never replaced after it is built (their bytes are addressed)."""

    def __init__(self, w: MoEWeights, cfg: MoEConfig) -> None:
        held, hidden, inter = len(w.gate_up), w.router.shape[1], cfg.moe_intermediate_size
        self._gate_up = (_Mat * held)(*[_mat(g) for g in w.gate_up])
        self._down = (_Proj * held)(*[_mat(d).part[0] for d in w.down])
        groups = max(cfg.n_group or 1, 1)
        self.args = _MoE(
            cfg.n_routed_experts, cfg.num_experts_per_tok, hidden, inter, w.first_expert, held,
            int(cfg.scoring == "sigmoid"), int(cfg.topk_method == "group_limited_greedy"),
            groups, cfg.topk_group or groups, int(cfg.norm_topk_prob),
            cfg.routed_scaling_factor, w.router.data_ptr(),
            None if w.score_bias is None else w.score_bias.data_ptr(),
            ctypes.addressof(self._gate_up), ctypes.addressof(self._down),
        )  # fmt: skip
        if w.shared_gate_up is not None:
            self.args.shared_gate_up = _mat(w.shared_gate_up)
            self.args.shared_down = _mat(w.shared_down).part[0]
        self._keep = (w.router, w.score_bias)

    @staticmethod
    def supported(w: MoEWeights, cfg: MoEConfig) -> bool:
        """Whether `q_moe` runs this layer: every expert's (and shared expert's) weights in
        integer-kernel block formats, a routing moe.py's `route` knows, the C kernels built."""
        if cpu_quant.library() is None or not isinstance(w.gate_up, list):
            return False
        hidden, inter, e = w.router.shape[1], cfg.moe_intermediate_size, cfg.n_routed_experts
        groups = max(cfg.n_group or 1, 1)
        grouped = cfg.scoring == "sigmoid" or cfg.topk_method == "group_limited_greedy"
        if cfg.scoring not in ("softmax", "sigmoid") or e % groups or (
            grouped and (cfg.topk_group or groups) * (e // groups) < cfg.num_experts_per_tok
        ):  # fmt: skip
            return False
        if w.router.dtype != torch.float32 or not w.router.is_contiguous() or (
            w.score_bias is not None and (w.score_bias.dtype != torch.float32
                                          or not w.score_bias.is_contiguous())
        ):  # fmt: skip
            return False
        experts = all(_c_weight(g, 2 * inter, hidden, True) and _c_weight(d, hidden, inter, False)
                      for g, d in zip(w.gate_up, w.down, strict=True))  # fmt: skip
        if w.shared_gate_up is None:
            return experts
        shared = w.shared_down.shape[1] if cpu_quant.is_quantized(w.shared_down) else 0
        return experts and bool(shared) and _c_weight(
            w.shared_gate_up, 2 * shared, hidden, True
        ) and _c_weight(w.shared_down, hidden, shared, False)  # fmt: skip

    def __call__(self, x: torch.Tensor, load: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output [rows, hidden] for x [rows, hidden] (float32 or bf16,
        contiguous); each expert's tokens added to `load` (int64 [E], contiguous) when given."""
        out = torch.empty_like(x)
        self.args.load = None if load is None else load.data_ptr()
        rc = cpu_quant.library().q_moe(ctypes.byref(self.args), x.data_ptr(), x.shape[0],
                                       out.data_ptr(), int(x.dtype == torch.bfloat16))  # fmt: skip
        if rc:
            raise RuntimeError(f"q_moe failed ({rc})")
        return out

    def chain_hook(self, load: torch.Tensor | None = None) -> ChainHook:
        """The layer's MLP half on the decode chain (csrc/moe.c's `q_moe_half`): these
        arguments with their own `load` (int64 [E], the model's per-layer count, which the
        chain's caller zeroes and totals as the per-layer forward does)."""
        args = _MoE.from_buffer_copy(self.args)
        args.load = None if load is None else load.data_ptr()
        fn = ctypes.cast(cpu_quant.library().q_moe_half, _PTR).value
        return ChainHook(fn, ctypes.addressof(args), keep=(args, self, load))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The C routing of x (`route`'s ids [rows, k] int64, weights [rows, k] float32; the
        ids of a row in descending order of their choice score)."""
        rows, k = x.shape[0], self.args.k
        ids = torch.empty(rows, k, dtype=torch.int64)
        weights = torch.empty(rows, k, dtype=torch.float32)
        rc = cpu_quant.library().q_moe_route(ctypes.byref(self.args), x.data_ptr(), rows,
                                             int(x.dtype == torch.bfloat16), ids.data_ptr(),
                                             weights.data_ptr())  # fmt: skip
        if rc:
            raise RuntimeError(f"q_moe_route failed ({rc})")
        return ids, weights


def moe_kernel(w: MoEWeights, cfg: MoEConfig) -> MoEKernel | None:
    """The layer's C experts (built once), or None where `MoEKernel.supported` says no."""
    if w.kernel is None:
        w.kernel = MoEKernel(w, cfg) if MoEKernel.supported(w, cfg) else False
    return w.kernel or None


def moe_forward(
    x: torch.Tensor,
    w: MoEWeights,
    cfg: MoEConfig,
    load: torch.Tensor | None = None,
    fast: bool = True,
) -> torch.Tensor:
    """Routed experts (grouped by expert) plus shared experts; adds this step's tokens per
    expert to `load` [E] when given. A decode batch goes through the C experts (`MoEKernel`)
    where they serve the layer, unless `fast` is False (the torch path)."""
    if fast and 0 < x.shape[0] < cpu_quant.DENSE_ROWS and x.dim() == 2 and x.is_contiguous() and (
        x.dtype in (torch.float32, torch.bfloat16) and x.device.type == "cpu"
    ) and (load is None or load.is_contiguous()):  # fmt: skip
        kernel = moe_kernel(w, cfg)
        if kernel is not None:
            return kernel(x, load)
    ids, weights = route(x, w, cfg)
    return routed_forward(x, w, cfg, ids, weights, load)


def routed_forward(
    x: torch.Tensor,
    w: MoEWeights,
    cfg: MoEConfig,
    ids: torch.Tensor,
    weights: torch.Tensor,
    load: torch.Tensor | None = None,
) -> torch.Tensor:
    """`moe_forward`'s torch path for a given routing (`route`'s ids and weights)."""
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
