"""Rotary position embeddings with the config's scaling (default, linear, llama3, yarn,
longrope).

The inverse frequencies and the cos/sin values are computed exactly as `transformers` computes
them (float32, `cat(freqs, freqs)`, rotate-half pairing), so logits match to float precision.
"""

from __future__ import annotations

import math

import torch

from runtime.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """`inv_freq` [head_dim / 2] float32 and the attention scaling factor for cos/sin."""
    dim = config.rope_dim
    base = config.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    rope_type = config.rope_type
    if rope_type == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif rope_type == "llama3":
        factor = float(scaling["factor"])
        low_freq_factor = float(scaling["low_freq_factor"])
        high_freq_factor = float(scaling["high_freq_factor"])
        old_context = float(scaling["original_max_position_embeddings"])
        low_freq_wavelen = old_context / low_freq_factor
        high_freq_wavelen = old_context / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        # long wavelengths are slowed by `factor`, short ones kept, the band between blended
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    elif rope_type == "yarn":
        return _yarn(inv_freq, dim, base, config)
    elif rope_type == "longrope":
        return longrope_frequencies(config, long=False)
    return inv_freq, 1.0


def longrope_frequencies(config: ModelConfig, long: bool) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3's `longrope`, formerly `su`): each frequency divided by its entry of
    `short_factor`, or of `long_factor` for sequences longer than
    `original_max_position_embeddings`; cos/sin scaled by
    sqrt(1 + log(factor) / log(original)), factor = max_position_embeddings / original unless
    given."""
    p = config.rope_scaling
    dim, base = config.rope_dim, config.rope_theta
    original = float(p["original_max_position_embeddings"])
    factor = p.get("factor")
    if factor is None:
        factor = config.max_position_embeddings / original
    attention = p.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = torch.tensor(p["long_factor" if long else "short_factor"], dtype=torch.float32)
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * base**exponents), float(attention)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(extrapolated: torch.Tensor, dim: int, base: float, config: ModelConfig):
    """YaRN: low frequencies interpolated by `factor`, high ones kept, a linear ramp between the
    `beta_fast` / `beta_slow` rotation counts; cos/sin scaled by the attention factor."""
    p = config.rope_scaling
    factor = float(p["factor"])
    original = float(p.get("original_max_position_embeddings") or config.max_position_embeddings)
    attention = p.get("attention_factor")
    if attention is None:
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all:
            attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all)
        else:
            attention = yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(p.get("beta_fast") or 32), correction_dim(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate
    interpolated = extrapolated / factor
    return interpolated * (1 - keep) + extrapolated * keep, float(attention)


def softmax_scale(config: ModelConfig, head_dim: int) -> float:
    """head_dim ** -0.5, times YaRN's mscale(factor, mscale_all_dim) squared where set (as
    DeepSeek's attention applies it)."""
    scale = head_dim**-0.5
    p = config.rope_scaling
    if config.rope_type != "default" and p.get("mscale_all_dim"):
        scale *= yarn_mscale(float(p["factor"]), float(p["mscale_all_dim"])) ** 2
    return scale


class RotaryEmbedding:
    """cos/sin for arbitrary positions, applied to q [T, Hq, D] and k [T, Hkv, D]."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        self.inv_freq, self.attention_scaling = inverse_frequencies(config)
        self.dim = config.rope_dim
        self.dtype = dtype
        self._cache_len = 0
        self._cos = self._sin = torch.empty(0)
        self._reserved = False  # grown once for every position: no per-step length check

    def _grow(self, length: int) -> None:
        length = max(length, 2 * self._cache_len, 4096)
        positions = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
        freqs = positions[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self._cos = (emb.cos() * self.attention_scaling).to(self.dtype)
        self._sin = (emb.sin() * self.attention_scaling).to(self.dtype)
        self._cache_len = length

    def reserve(self, length: int) -> None:
        """Grow the tables to `length` positions once and stop checking each step's positions
        against them (the check reads the largest position back to the host, which a captured
        CUDA graph may not do). The caller keeps positions below `length` (the scheduler
        refuses sequences past the model's context)."""
        if length > self._cache_len:
            self._grow(length)
        self._reserved = True

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, D] for positions [T] (int64)."""
        if not self._reserved:
            needed = int(positions.max()) + 1 if positions.numel() else 0
            if needed > self._cache_len:
                self._grow(needed)
        return self._cos[positions][:, None, :], self._sin[positions][:, None, :]

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole cos and sin tables [P, D], grown to cover `positions` (for kernels that
        index them themselves)."""
        needed = int(positions.max()) + 1 if positions.numel() else 0
        if needed > self._cache_len:
            self._grow(needed)
        return self._cos, self._sin

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """`apply_rotary` (rotate-half pairing), for the attention backends; tables narrower
        than x's heads rotate their first values (partial rotary)."""
        rd = cos.shape[-1]
        if rd == x.shape[-1]:
            return apply_rotary(x, cos, sin)
        return torch.cat((apply_rotary(x[..., :rd], cos, sin), x[..., rd:]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with x [T, H, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def apply_rotary_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x0, x1), (x2, x3), ... (DeepSeek's layout); the result lists the rotated
    first members, then the second ones. Queries and keys get the same layout, so their dot
    products equal those of the interleaved rotation."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half], sin[..., :half]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat((even * c - odd * s, odd * c + even * s), dim=-1)


class DecodeTables:
    """LongRoPE's rotary for decode-only steps (the Rotary protocol): table row p is the short
    tables' below `original` and the long ones' from it. A decode token's request reaches past
    the original context exactly when its own position does (p + 1 > original), so this is the
    table the per-token choice of the layer-by-layer forward (`torch.where` of short and long
    rows) reads, in one table the fused C kernels index by position. Not for extend chunks: a
    chunk reaching past `original` rotates all its tokens with the long factors."""

    def __init__(self, short: RotaryEmbedding, long: RotaryEmbedding, original: int) -> None:
        self.short, self.long, self.original = short, long, original
        self.dim = short.dim
        self._key: tuple = ()
        self._tables: tuple[torch.Tensor, torch.Tensor] = (torch.empty(0), torch.empty(0))

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos_s, sin_s = self.short.tables(positions)
        cos_l, sin_l = self.long.tables(positions)
        key = (cos_s.data_ptr(), cos_l.data_ptr(), cos_s.shape[0], cos_l.shape[0])
        if key != self._key:  # rebuilt when either table grows
            n, cut = min(cos_s.shape[0], cos_l.shape[0]), self.original
            self._tables = (torch.cat((cos_s[:cut], cos_l[cut:n])).contiguous(),
                            torch.cat((sin_s[:cut], sin_l[cut:n])).contiguous())  # fmt: skip
            self._key = key
        return self._tables

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.tables(positions)
        return cos[positions][:, None, :], sin[positions][:, None, :]

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.short.rotate(x, cos, sin)
