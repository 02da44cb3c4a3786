"""How much KV cache a model needs: `python -m runtime.kv_size MODEL_DIR_OR_CONFIG`.

    bytes_per_token = 2 (K and V) x layers x kv_heads x head_dim x dtype_bytes

Prints that figure, the total for `--context` tokens x `--batch` sequences, and the same
model with full multi-head attention (kv_heads = heads) to show what GQA saves.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.config import ModelConfig, load_config

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2,
               "fp8": 1, "int8": 1}  # fmt: skip


@dataclass(slots=True)
class KVSize:
    bytes_per_token: int
    total_bytes: int
    mha_bytes_per_token: int
    mha_total_bytes: int


def kv_size(config: ModelConfig, context: int, batch: int, dtype_bytes: int) -> KVSize:
    per_token = config.kv_bytes_per_token(dtype_bytes)
    mha = dataclasses.replace(config, num_kv_heads=config.num_heads)
    mha_per_token = mha.kv_bytes_per_token(dtype_bytes)
    tokens = context * batch
    return KVSize(per_token, per_token * tokens, mha_per_token, mha_per_token * tokens)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if float(n).is_integer() else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def report(config: ModelConfig, context: int, batch: int, dtype: str) -> str:
    size = kv_size(config, context, batch, DTYPE_BYTES[dtype])
    c = config
    rows = [
        ("attention", "bytes/token", f"per sequence ({context} tokens)", f"batch of {batch}"),
        (f"GQA ({c.num_kv_heads} kv heads)", human_bytes(size.bytes_per_token),
         human_bytes(size.bytes_per_token * context), human_bytes(size.total_bytes)),
        (f"MHA ({c.num_heads} kv heads)", human_bytes(size.mha_bytes_per_token),
         human_bytes(size.mha_bytes_per_token * context), human_bytes(size.mha_total_bytes)),
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        f"{c.model_type}: {c.num_layers} layers, {c.num_heads} heads, {c.num_kv_heads} kv heads, "
        f"head_dim {c.head_dim}, dtype {dtype} ({DTYPE_BYTES[dtype]} bytes)",
        f"bytes_per_token = 2 x {c.num_layers} x {c.num_kv_heads} x {c.head_dim} x "
        f"{DTYPE_BYTES[dtype]} = {size.bytes_per_token} ({human_bytes(size.bytes_per_token)})",
    ]
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    saving = size.mha_bytes_per_token / size.bytes_per_token
    lines.append(f"GQA uses {saving:g}x less KV memory than MHA")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.kv_size", description=__doc__)
    parser.add_argument("model", help="a model folder or a config.json file")
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_BYTES))
    args = parser.parse_args(argv)
    sys.stdout.write(report(load_config(args.model), args.context, args.batch, args.dtype) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
