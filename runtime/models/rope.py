"""Rotary position embeddings with the config's scaling (default, linear, llama3).

The inverse frequencies and the cos/sin values are computed exactly as `transformers` computes
them (float32, `cat(freqs, freqs)`, rotate-half pairing), so logits match to float precision.
"""

from __future__ import annotations

import math

import torch

from runtime.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """`inv_freq` [head_dim / 2] float32 and the attention scaling factor for cos/sin."""
    dim = config.head_dim
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
    return inv_freq, 1.0


class RotaryEmbedding:
    """cos/sin for arbitrary positions, applied to q [T, Hq, D] and k [T, Hkv, D]."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype) -> None:
        self.inv_freq, self.attention_scaling = inverse_frequencies(config)
        self.dtype = dtype
        self._cache_len = 0
        self._cos = self._sin = torch.empty(0)

    def _grow(self, length: int) -> None:
        length = max(length, 2 * self._cache_len, 4096)
        positions = torch.arange(length, dtype=torch.float32)
        freqs = positions[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self._cos = (emb.cos() * self.attention_scaling).to(self.dtype)
        self._sin = (emb.sin() * self.attention_scaling).to(self.dtype)
        self._cache_len = length

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, D] for positions [T] (int64)."""
        needed = int(positions.max()) + 1 if positions.numel() else 0
        if needed > self._cache_len:
            self._grow(needed)
        return self._cos[positions][:, None, :], self._sin[positions][:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with x [T, H, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
