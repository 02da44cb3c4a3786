"""Multi-head Latent Attention: KV memory and decode speed, side by side in one run.

Run: .venv/bin/python -m benchmarks.engine.mla [--quick]

Models (tiny, random, fp32, CPU; the same hidden size 256 and 4 layers, 8 query heads):
  deepseek-v3  MLA: a latent of kv_lora_rank 64 + qk_rope_head_dim 16 per token (per head the
               query/key has 32 nope + 16 rope dims, the value 32), MoE after layer 1
  llama-mha    8 KV heads of 32 dims (K and V)
  llama-gqa    2 KV heads of 32 dims

Table 1: bytes per token (measured by the engine vs the formula) and tokens that fit in a 1 GiB
pool (vs budget / bytes per token). Table 2: decode tokens/s at 1k and 4k context (4 requests of
that many prompt tokens, 32 new tokens each, the prompts already in the radix cache); for MLA
the absorbed latent path and decompressing every cached latent to per-head K/V at every step.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from runtime import Engine
from runtime.config import load_config
from tests.support.tiny_models import make_tiny_model

SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
             max_position_embeddings=8192)  # fmt: skip
MODELS = {
    "deepseek-v3": ("deepseek_v3", dict(kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=32,
                                        v_head_dim=32, q_lora_rank=96, moe_intermediate_size=128,
                                        num_key_value_heads=8)),
    "llama-mha": ("llama", dict(num_key_value_heads=8)),
    "llama-gqa": ("llama", dict(num_key_value_heads=2)),
}  # fmt: skip
BUDGET_GB = 1.0
NEW_TOKENS = 32
REQUESTS = 4


def formula(config) -> int:
    """fp32 bytes per token from the config alone."""
    if config.mla:
        return config.num_layers * (config.mla.kv_lora_rank + config.mla.qk_rope_head_dim) * 4
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4


def decode_rate(engine: Engine, context: int, vocab: int) -> float:
    """Decode tokens/s of REQUESTS requests with `context` cached prompt tokens each."""
    gen = torch.Generator().manual_seed(context)
    prompts = [
        torch.randint(100, vocab, (context,), generator=gen).tolist() for _ in range(REQUESTS)
    ]
    engine.generate(prompts, max_new_tokens=0)  # prefill into the radix cache
    start = time.perf_counter()
    out = engine.generate(prompts, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                          temperature=0.0)  # fmt: skip
    seconds = time.perf_counter() - start
    assert all(len(r.token_ids) == NEW_TOKENS for r in out)
    return REQUESTS * NEW_TOKENS / seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="contexts 256 and 1024 only")
    args = parser.parse_args(argv)
    contexts = (256, 1024) if args.quick else (1024, 4096)
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    work = Path(tempfile.mkdtemp(prefix="bench-mla-"))
    memory_rows, speed_rows, per_token = [], [], {}
    for name, (kind, overrides) in MODELS.items():
        folder = make_tiny_model(work / name, kind, **SHAPE, **overrides)
        config = load_config(folder)
        with Engine(str(folder), mem_budget_gb=BUDGET_GB, page_size=16) as engine:
            stats = engine.stats()
            measured, expected = stats["kv_bytes_per_token"], formula(config)
            fit = stats["kv_capacity_tokens"]
            ideal = BUDGET_GB * 1024**3 / measured
            per_token[name] = measured
            memory_rows.append((name, measured, expected, fit, ideal))
            paths = ["absorbed", "decompressed"] if config.mla else ["-"]
            for path in paths:
                if config.mla:
                    engine.model.absorb = path == "absorbed"
                rates = [decode_rate(engine, n, config.vocab_size) for n in contexts]
                speed_rows.append((name, path, *rates))
    print(f"KV memory (fp32, {BUDGET_GB:g} GiB pool)\n")
    print("| model | bytes/token (engine) | formula | equal | tokens in pool | "
          "budget / bytes | within 5% | vs MLA |")  # fmt: skip
    print("|---|---:|---:|---|---:|---:|---|---:|")
    for name, measured, expected, fit, ideal in memory_rows:
        ratio = measured / per_token["deepseek-v3"]
        print(f"| {name} | {measured:,} | {expected:,} | {measured == expected} | {fit:,} | "
              f"{ideal:,.0f} | {abs(fit - ideal) / ideal <= 0.05} | {ratio:.1f}x |")  # fmt: skip
    print(f"\nDecode tokens/s ({REQUESTS} requests, {NEW_TOKENS} new tokens, cached prompts)\n")
    print("| model | attention path | " + " | ".join(f"{n} ctx tok/s" for n in contexts) + " |")
    print("|---|---|" + "---:|" * len(contexts))
    for name, path, *rates in speed_rows:
        print(f"| {name} | {path} | " + " | ".join(f"{r:.1f}" for r in rates) + " |")
    mla = {path: rates for name, path, *rates in speed_rows if name == "deepseek-v3"}
    speedup = mla["absorbed"][-1] / mla["decompressed"][-1]
    print(f"\nabsorbed / decompressed at {contexts[-1]} context: {speedup:.2f}x")


if __name__ == "__main__":
    main()
