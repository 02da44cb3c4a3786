"""Calibrated fp8 KV storage: per-layer scales and per-channel offsets, measured once.

An fp8 value keeps 3 (e4m3) or 2 (e5m2) mantissa bits: its error is a fixed share of its
magnitude, and below the smallest normal (2^-6 for e4m3, 2^-14 for e5m2, times the scale) a
fixed absolute step. Two things make that error smaller without changing what attention
computes:

- an offset: many key and value channels sit around a large mean with a small spread. The pool
  stores `(x - m) / s` with m the channel's mean (per layer, KV head and channel), so the
  rounding error scales with the spread, not the mean. For keys this is exact: q . (k - m)
  differs from q . k by q . m, the same for every key of a query, and the softmax cancels it
  (SageAttention's "smooth K"). For values the backends add m back to the output (the
  probabilities sum to 1). MLA's latent is key and value at once: the same holds. Logit
  soft-capping is not shift-invariant: a model with it gets no key offset.
- a scale: `s` a power of two (so dividing by it is exact) that puts the largest measured
  deviation at a quarter of the type's largest value: headroom for unseen outliers, and the
  bulk of the values far above the subnormals.

`measure` runs the model once over CALIBRATION_TEXT (shipped here, written for this purpose;
nothing is downloaded) through the torch reference backend into a temporary pool of the
model's dtype, whatever backend the engine serves with, so every backend, a parallel engine's
workers and both sides of a prefill-decode hand-off get the same numbers from the same model
(`KVPool.calibration_digest` names them for the hand-off's layout check). A checkpoint's own scales
(kv_pool.checkpoint_kv_scales) take precedence: then nothing is measured and no offset is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.attention.torch_backend import TorchBackend
from runtime.config import ModelConfig
from runtime.memory.kv_pool import FP8_DTYPES, KVPool

HEADROOM = 4.0  # the largest measured deviation is stored at 1/HEADROOM of the type's maximum
_PAGE = 16

CALIBRATION_TEXT = """\
The train left the station a few minutes after seven, and most of the passengers were still \
half asleep. A woman by the window opened a paper map and traced the line of the river with \
her finger, counting the bridges they would cross before noon. Across the aisle, two students \
argued quietly about whether the museum would be open on a public holiday.

Q: How many legs does a spider have?
A: Eight.
Q: What is the boiling point of water at sea level in degrees Celsius?
A: 100 degrees.
Q: Which planet is closest to the sun?
A: Mercury.

To make a simple tomato soup, soften a chopped onion in olive oil, add two cloves of garlic \
and a tin of tomatoes, season with salt and pepper, and let it simmer for twenty minutes. \
Blend until smooth and finish with a spoonful of cream.

def mean(values):
    \"\"\"Return the arithmetic mean of a non-empty list.\"\"\"
    total = 0.0
    for v in values:
        total += v
    return total / len(values)

print(mean([3, 5, 8, 13]))

User: Can you explain what a prime number is?
Assistant: A prime number is a whole number greater than one whose only divisors are one and \
itself. For example, 2, 3, 5, 7 and 11 are prime, while 9 is not, because it can be divided \
by 3.

In the spring of that year the farmers planted barley on the high fields and beans near the \
stream. The weather was kind: rain came at night and the days were bright, and by midsummer \
the valley was green from one end to the other. Older people said they had not seen such a \
harvest since they were children.

{"name": "Ada", "age": 36, "languages": ["English", "French"], "active": true}

1. Read the instructions carefully.
2. Gather the tools you need before you start.
3. Work slowly, and check each step before moving on.

The committee met on Thursday to review the budget. After a long discussion, it agreed to \
repair the library roof first, to buy new chairs for the school hall in the autumn, and to ask \
the town council for help with the cost of the playground.
"""


@dataclass(frozen=True)
class KVCalibration:
    """Per tensor name ("k", "v"; MLA's "latent"), per layer: the scale and the [heads, dim]
    float32 offset (None: none). What `KVPool(scales=..., offsets=...)` takes."""

    scales: dict[str, list[float]]
    offsets: dict[str, list[torch.Tensor | None]]

    def kwargs(self) -> dict:
        """`KVPool` keywords: scales and offsets."""
        return {"scales": self.scales, "offsets": self.offsets}

    def select(self, layers: list[int], kv_heads: slice) -> KVCalibration:
        """A rank's part: its `layers` and, of tensors with several heads, its `kv_heads`."""

        def part(o: torch.Tensor | None) -> torch.Tensor | None:
            return o if o is None or o.shape[0] == 1 else o[kv_heads]

        return KVCalibration(
            {n: [s[i] for i in layers] for n, s in self.scales.items()},
            {n: [part(o[i]) for i in layers] for n, o in self.offsets.items()},
        )


def _calibration_batch(n: int) -> ForwardBatch:
    """One extend of `n` tokens into pages 1, 2, ... of a fresh pool."""
    pages = torch.arange(1, 1 + -(-n // _PAGE), dtype=torch.int32)
    none = torch.zeros(0, 1, dtype=torch.int32)
    return ForwardBatch(
        input_ids=torch.zeros(n, dtype=torch.long),  # set by the caller
        positions=torch.arange(n), out_slots=torch.arange(n) + _PAGE, num_decode=0,
        decode_page_table=none, decode_seq_lens=torch.zeros(0, dtype=torch.int32),
        extend_page_table=pages[None], extend_prefix_lens=torch.zeros(1, dtype=torch.int32),
        extend_lens=torch.tensor([n], dtype=torch.int32), logit_rows=torch.tensor([n - 1]),
    )  # fmt: skip


def _power_of_two_scale(amax: float, fp8: torch.dtype) -> float:
    """The power of two s with amax / s within [max / (2 HEADROOM), max / HEADROOM]."""
    if not amax > 0 or not math.isfinite(amax):
        return 1.0
    return 2.0 ** math.ceil(math.log2(amax * HEADROOM / torch.finfo(fp8).max))


def measure(
    model, config: ModelConfig, ids: list[int], dtype: torch.dtype, fp8: torch.dtype,
    smooth: bool = True,
) -> KVCalibration:  # fmt: skip
    """Run `model` (a single-process model of `config`, weights in `dtype`) over `ids` through
    the torch backend and derive each layer's scales and (with `smooth`) offsets for `fp8`
    storage."""
    n = len(ids)
    pool = KVPool(config, -(-n // _PAGE) + 1, _PAGE, dtype)
    batch = _calibration_batch(n)
    batch.input_ids = torch.tensor(ids, dtype=torch.long)
    own = model.attention
    model.attention = TorchBackend()  # the same numbers whatever the engine's backend
    try:
        model.forward(batch, pool)
    finally:
        model.attention = own
    key_offsets = smooth and config.attn_logit_softcapping is None
    scales: dict[str, list[float]] = {}
    offsets: dict[str, list[torch.Tensor | None]] = {}
    for name, heads, dim in pool.layout:
        scales[name], offsets[name] = [], []
        for layer in range(config.num_layers):
            x = pool.buffers[name][layer].view(-1, heads, dim)[_PAGE : _PAGE + n].float()
            offset = None
            if (smooth and name != "k") or key_offsets:
                # the first position is an outlier in most models (an attention sink): not
                # counted in the mean; the largest deviation counts every position
                offset = x[1:].mean(dim=0).to(torch.bfloat16).float() if n > 1 else None
            dev = x if offset is None else x - offset
            scales[name].append(_power_of_two_scale(float(dev.abs().max()), fp8))
            offsets[name].append(offset)
    return KVCalibration(scales, offsets)


CHOICES = ("smooth", "scale", "none")


def kv_calibration_kind(
    kv_dtype: torch.dtype, requested: str, checkpoint_scales: dict[str, list[float]]
) -> str | None:
    """What an engine's fp8 pool uses: "smooth" (measured scales and offsets), "scale"
    (measured scales), "none" (scale 1.0, SGLang's default), "checkpoint" (the checkpoint's
    scales win over any request); None for a pool that is not fp8."""
    if requested not in CHOICES:
        raise ValueError(f"kv_calibration must be one of {list(CHOICES)}, got {requested!r}")
    if kv_dtype not in FP8_DTYPES:
        return None
    return "checkpoint" if checkpoint_scales else requested


def calibrate(
    model, config: ModelConfig, tokenizer, dtype: torch.dtype, fp8: torch.dtype,
    smooth: bool = True,
) -> KVCalibration:  # fmt: skip
    """`measure` over CALIBRATION_TEXT."""
    ids = list(tokenizer(CALIBRATION_TEXT).input_ids)
    return measure(model, config, ids, dtype, fp8, smooth=smooth)
