"""How much KV cache a model needs: `python -m runtime.kv_size MODEL_DIR_OR_CONFIG`.

    bytes_per_token = 2 (K and V) x layers x kv_heads x head_dim x dtype_bytes
    MLA (DeepSeek V2 / V3):  layers x (kv_lora_rank + qk_rope_head_dim) x dtype_bytes

Sliding-window models (Gemma 3) also get their window layers' cap: at most `sliding_window`
tokens per sequence in those layers.

Prints that figure, the total for `--context` tokens x `--batch` sequences, and the same
model with full multi-head attention (kv_heads = heads) to show what GQA saves; for an MLA
model also what per-head K ((qk_nope + qk_rope) dims) and V (v_head_dim) would take with every
head (MHA) and with 8 KV heads (GQA).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.config import ModelConfig, load_config

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
               "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}  # fmt: skip


@dataclass(slots=True)
class KVSize:
    bytes_per_token: int
    total_bytes: int
    mha_bytes_per_token: int
    mha_total_bytes: int


MLA_GQA_HEADS = 8  # the GQA variant an MLA model is compared with


def per_head_bytes_per_token(config: ModelConfig, kv_heads: int, dtype_bytes: int) -> int:
    """K and V of `kv_heads` heads per token: what the model would cache without a latent."""
    if config.mla:
        per_head = config.mla.qk_head_dim + config.mla.v_head_dim
        return config.num_layers * kv_heads * per_head * dtype_bytes
    plain = dataclasses.replace(config, num_kv_heads=kv_heads)
    return plain.kv_bytes_per_token(dtype_bytes)


def kv_size(config: ModelConfig, context: int, batch: int, dtype_bytes: int) -> KVSize:
    per_token = config.kv_bytes_per_token(dtype_bytes)
    mha_per_token = per_head_bytes_per_token(config, config.num_heads, dtype_bytes)
    tokens = context * batch
    return KVSize(per_token, per_token * tokens, mha_per_token, mha_per_token * tokens)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if float(n).is_integer() else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def mla_report(config: ModelConfig, context: int, batch: int, dtype: str) -> str:
    b, c, m = DTYPE_BYTES[dtype], config, config.mla
    size = kv_size(config, context, batch, b)
    gqa = per_head_bytes_per_token(config, MLA_GQA_HEADS, b)

    def row(name: str, per_token: int) -> tuple[str, ...]:
        return (name, human_bytes(per_token), human_bytes(per_token * context),
                human_bytes(per_token * context * batch))  # fmt: skip

    lines = [
        f"{c.model_type}: {c.num_layers} layers, {c.num_heads} heads, MLA kv_lora_rank "
        f"{m.kv_lora_rank}, qk_rope_head_dim {m.qk_rope_head_dim} (per head: qk "
        f"{m.qk_head_dim}, v {m.v_head_dim}), dtype {dtype} ({b} bytes)",
        f"bytes_per_token = {c.num_layers} x ({m.kv_lora_rank} + {m.qk_rope_head_dim}) x {b} = "
        f"{size.bytes_per_token} ({size.bytes_per_token:,} bytes, "
        f"{human_bytes(size.bytes_per_token)})",
        *_table(
            [
                (
                    "attention",
                    "bytes/token",
                    f"per sequence ({context} tokens)",
                    f"batch of {batch}",
                ),
                ("MLA (latent)", *row("", size.bytes_per_token)[1:]),
                (f"GQA ({MLA_GQA_HEADS} kv heads)", *row("", gqa)[1:]),
                (f"MHA ({c.num_heads} kv heads)", *row("", size.mha_bytes_per_token)[1:]),
            ]
        ),  # fmt: skip
        f"MHA would take {c.num_heads} x ({m.qk_head_dim} + {m.v_head_dim}) x {c.num_layers} x "
        f"{b} = {size.mha_bytes_per_token:,} bytes per token: MLA uses "
        f"{size.mha_bytes_per_token / size.bytes_per_token:.1f}x less than MHA, "
        f"{gqa / size.bytes_per_token:.1f}x less than GQA with {MLA_GQA_HEADS} kv heads",
    ]
    return "\n".join(lines)


def report(config: ModelConfig, context: int, batch: int, dtype: str) -> str:
    if config.mla:
        return mla_report(config, context, batch, dtype)
    size = kv_size(config, context, batch, DTYPE_BYTES[dtype])
    c = config
    rows = [
        ("attention", "bytes/token", f"per sequence ({context} tokens)", f"batch of {batch}"),
        (f"GQA ({c.num_kv_heads} kv heads)", human_bytes(size.bytes_per_token),
         human_bytes(size.bytes_per_token * context), human_bytes(size.total_bytes)),
        (f"MHA ({c.num_heads} kv heads)", human_bytes(size.mha_bytes_per_token),
         human_bytes(size.mha_bytes_per_token * context), human_bytes(size.mha_total_bytes)),
    ]  # fmt: skip
    lines = [
        f"{c.model_type}: {c.num_layers} layers, {c.num_heads} heads, {c.num_kv_heads} kv heads, "
        f"head_dim {c.head_dim}, dtype {dtype} ({DTYPE_BYTES[dtype]} bytes)",
        f"bytes_per_token = 2 x {c.num_layers} x {c.num_kv_heads} x {c.head_dim} x "
        f"{DTYPE_BYTES[dtype]} = {size.bytes_per_token} ({human_bytes(size.bytes_per_token)})",
    ]
    lines += _table(rows)
    saving = size.mha_bytes_per_token / size.bytes_per_token
    lines.append(f"GQA uses {saving:g}x less KV memory than MHA")
    if c.window_layers:
        lines += window_lines(c, context, batch, DTYPE_BYTES[dtype])
    return "\n".join(lines)


def window_lines(config: ModelConfig, context: int, batch: int, dtype_bytes: int) -> list[str]:
    """The window layers' cap: they keep at most `sliding_window` tokens per sequence."""
    c, w = config, int(config.sliding_window or 0)
    per_layer = c.kv_bytes_per_token(dtype_bytes) // c.num_layers
    window_bytes, global_bytes = (
        per_layer * c.window_layers,
        per_layer * (c.num_layers - c.window_layers),
    )
    capped = global_bytes * context + window_bytes * min(context, w)
    uncapped = c.kv_bytes_per_token(dtype_bytes) * context * batch
    return [
        f"sliding window: {c.window_layers} of {c.num_layers} layers attend to the last {w} "
        f"tokens; their KV is capped at {w} tokens per sequence",
        f"bytes/token by layer kind: global {global_bytes} ({human_bytes(global_bytes)}), "
        f"window {window_bytes} ({human_bytes(window_bytes)}, for at most {w} tokens)",
        f"with the cap: per sequence ({context} tokens) {human_bytes(capped)}, batch of {batch} "
        f"{human_bytes(capped * batch)} (without the cap: {human_bytes(uncapped)})",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.kv_size", description=__doc__)
    parser.add_argument("model", help="a model folder or a config.json file")
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences")
    parser.add_argument(
        "--dtype",
        "--kv-dtype",
        dest="dtype",
        default="bf16",
        choices=sorted(DTYPE_BYTES),
        help="the KV cache's storage type (the engine's kv_cache_dtype; fp8_*: 1 byte)",
    )
    args = parser.parse_args(argv)
    sys.stdout.write(report(load_config(args.model), args.context, args.batch, args.dtype) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
