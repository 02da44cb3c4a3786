"""The KV cache dtype trade-off on the default model (weights in bf16).

Run: .venv/bin/python -m benchmarks.kv_quant [--prompts 32] [--tokens 64] [--kv bf16,fp8_e4m3]

For each KV dtype: KV bytes per token (the engine's, and the formula's) and tokens per GiB;
greedy agreement with the bf16 cache over `--prompts` prompts x `--tokens` new tokens (share of
equal tokens, up to the first difference counted per prompt, and share of prompts equal
throughout); perplexity of TEXT below (written for this benchmark); decode tokens/s (all
prompts batched) and few-shot tokens/s (a shared few-shot prefix, short answers). Targets: half
the bytes and twice the capacity of bf16, perplexity within 1%, throughput at most 10% below.
"""

from __future__ import annotations

import argparse
import math
import time

from runtime import Engine

# a fixed text for the perplexity column (written for this benchmark)
TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. From the top he "
    "could see the fishing boats coming home, their lamps swinging with the waves. In winter "
    "the wind was so strong that the glass rattled in its frame, and he wrapped a wool scarf "
    "twice around his neck before he lit the great lamp. He kept a notebook of every ship "
    "that passed: its name, the hour, the colour of its sails and the state of the sea. Over "
    "thirty years the notebook had grown into a shelf of notebooks, and the children of the "
    "village came to read them on rainy afternoons, tracing the names of boats their "
    "grandparents had sailed."
)
SUBJECTS = [
    "the ocean", "a small village", "the history of bread", "a quiet library",
    "mountain weather", "an old clock", "the first computers", "a summer garden",
]  # fmt: skip
STARTS = ["Write a short paragraph about", "Tell me a fact about", "Describe",
          "Explain to a child"]  # fmt: skip
FEW_SHOT = (
    "Q: What is the capital of France?\nA: Paris\n"
    "Q: What is the capital of Italy?\nA: Rome\n"
    "Q: What is the capital of Spain?\nA: Madrid\n"
    "Q: What is the capital of Germany?\nA: Berlin\n"
)
COUNTRIES = ["Portugal", "Austria", "Poland", "Greece", "Norway", "Sweden", "Japan", "Egypt"]


def prompts(n: int) -> list[str]:
    return [f"{STARTS[i % len(STARTS)]} {SUBJECTS[i % len(SUBJECTS)]} (part {i // 8 + 1})."
            for i in range(n)]  # fmt: skip


def measure(kv: str, args: argparse.Namespace) -> dict:
    with Engine(dtype="bfloat16", kv_cache_dtype=kv, mem_budget_gb=args.budget_gb) as engine:
        stats = engine.stats()
        start = time.perf_counter()
        outs = engine.generate(prompts(args.prompts), max_new_tokens=args.tokens, temperature=0.0,
                               ignore_eos=True)  # fmt: skip
        decode_s = time.perf_counter() - start
        tokens = [o.token_ids for o in outs]
        ids = engine.tokenizer(TEXT, add_special_tokens=False).input_ids
        logprob = engine.score(ids[:1], [ids[1:]])[0]
        shots = [FEW_SHOT + f"Q: What is the capital of {c}?\nA:" for c in COUNTRIES]
        engine.generate(shots[:1], max_new_tokens=4, temperature=0.0)  # the prefix, cached
        start = time.perf_counter()
        few = engine.generate(shots, max_new_tokens=8, temperature=0.0, ignore_eos=True)
        few_s = time.perf_counter() - start
    return {
        "kv": kv,
        "bytes": stats["kv_bytes_per_token"],
        "per_gib": 1024**3 // stats["kv_bytes_per_token"],
        "tokens": tokens,
        "ppl": math.exp(-logprob / (len(ids) - 1)),
        "decode_tps": sum(len(t) for t in tokens) / decode_s,
        "few_tps": sum(len(o.token_ids) for o in few) / few_s,
    }


def agreement(ref: list[list[int]], got: list[list[int]]) -> tuple[float, float]:
    """(share of equal tokens position by position, share of prompts equal throughout)."""
    same = sum(a == b for x, y in zip(ref, got, strict=True) for a, b in zip(x, y, strict=False))
    total = sum(len(x) for x in ref)
    whole = sum(x == y for x, y in zip(ref, got, strict=True))
    return same / total, whole / len(ref)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kv_quant", description=__doc__)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--kv", default="bf16,fp8_e4m3,fp8_e5m2")
    p.add_argument("--budget-gb", type=float, default=0.05)
    args = p.parse_args()
    rows = [measure(kv, args) for kv in args.kv.split(",")]
    ref = rows[0]
    print(f"default model, weights bf16; {args.prompts} prompts x {args.tokens} tokens; "
          f"agreement and ratios against KV {ref['kv']}")  # fmt: skip
    head = ("kv dtype", "bytes/tok", "tokens/GiB", "equal tok", "equal prompts", "ppl",
            "ppl vs ref", "decode tok/s", "few-shot tok/s")  # fmt: skip
    print(" | ".join(head))
    for r in rows:
        tok, whole = agreement(ref["tokens"], r["tokens"])
        print(" | ".join([
            r["kv"], str(r["bytes"]), f"{r['per_gib']:,}", f"{tok:.1%}", f"{whole:.1%}",
            f"{r['ppl']:.3f}", f"{r['ppl'] / ref['ppl'] - 1:+.2%}",
            f"{r['decode_tps']:.1f} ({r['decode_tps'] / ref['decode_tps'] - 1:+.0%})",
            f"{r['few_tps']:.1f} ({r['few_tps'] / ref['few_tps'] - 1:+.0%})",
        ]))  # fmt: skip


if __name__ == "__main__":
    main()
