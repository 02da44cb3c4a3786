"""The KV cache dtype trade-off on the default model (weights in bf16).

Run: .venv/bin/python -m benchmarks.engine.kv_quant [--prompts 32] [--tokens 64] [--repeats 3]
     [--chat] [--kv bf16,fp8_e4m3,fp8_e5m2] [--calibration smooth]

For each KV dtype (one engine each, all open at once): KV bytes per token and tokens per GiB;
agreement with the first dtype's cache (bf16) over `--prompts` prompts x `--tokens` new tokens,
each run free, greedy, from its own previous tokens: "equal tokens" is the share of positions
i (over all prompts) where token i equals the bf16 run's token i, position by position (after a
first difference the continuations usually part, so later positions mostly count as unequal);
"equal prompts" the share of prompts whose tokens are all equal; "first diff" the mean share
of a prompt's tokens before its first difference. Perplexity of HELD_OUT below (written for
this benchmark; not the calibration text, runtime/attention/kv_calibration.py). Decode tokens/s
(all prompts batched) and few-shot tokens/s (a shared few-shot prefix, short answers): each a
median over `--repeats` runs that alternate between the dtypes (the machine may be shared).
Targets: half the bytes and twice the capacity of bf16, perplexity within 1%, throughput at
most 10% below, free-running greedy agreement >= 90% of positions.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

from runtime import Engine

# held-out text for the perplexity column (written for this benchmark; fp8 pools are
# calibrated on another text, kv_calibration.CALIBRATION_TEXT)
HELD_OUT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. From the top he "
    "could see the fishing boats coming home, their lamps swinging with the waves. In winter "
    "the wind was so strong that the glass rattled in its frame, and he wrapped a wool scarf "
    "twice around his neck before he lit the great lamp. He kept a notebook of every ship "
    "that passed: its name, the hour, the colour of its sails and the state of the sea. Over "
    "thirty years the notebook had grown into a shelf of notebooks, and the children of the "
    "village came to read them on rainy afternoons, tracing the names of boats their "
    "grandparents had sailed.\n\n"
    "When the new road reached the town, the market changed within a single season. Farmers "
    "who had once walked for half a day with baskets of eggs now arrived before sunrise in "
    "small trucks, and the square filled with voices long before the church bell rang eight. "
    "The baker doubled his morning batch, then doubled it again, and still sold out by ten.\n\n"
    "A good recipe for bread needs only four things: flour, water, salt and yeast. Mix them "
    "into a rough dough, leave it covered for an hour, then fold it gently a few times and let "
    "it rise again. Bake it in a hot oven until the crust is deep brown and the loaf sounds "
    "hollow when you tap its base.\n\n"
    "Question: Why does the moon look larger near the horizon?\n"
    "Answer: It is mostly an illusion. The moon is about the same distance from us all night, "
    "but near the horizon our brain compares it with trees and buildings and judges it to be "
    "bigger.\n\n"
    "The museum closes at six on weekdays and at eight on Saturdays. Guided tours start every "
    "hour from the main hall, and tickets for children under twelve are free."
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


def chat_prompts(engine: Engine, n: int) -> list[str]:
    """The same requests as a chat user sends them: through the model's chat template."""
    return [engine.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 tokenize=False, add_generation_prompt=True)
            for text in prompts(n)]  # fmt: skip


def open_engine(kv: str, args: argparse.Namespace) -> Engine:
    return Engine(dtype="bfloat16", kv_cache_dtype=kv, mem_budget_gb=args.budget_gb,
                  kv_calibration=args.calibration)  # fmt: skip


def accuracy(engine: Engine, args: argparse.Namespace) -> dict:
    """Sizes, greedy tokens and held-out perplexity of one engine."""
    stats = engine.stats()
    if args.chat:  # answers end where the model ends them
        outs = engine.generate(chat_prompts(engine, args.prompts), max_new_tokens=args.tokens,
                               temperature=0.0)  # fmt: skip
    else:
        outs = engine.generate(prompts(args.prompts), max_new_tokens=args.tokens,
                               temperature=0.0, ignore_eos=True)  # fmt: skip
    ids = engine.tokenizer(HELD_OUT, add_special_tokens=False).input_ids
    logprob = engine.score(ids[:1], [ids[1:]])[0]
    return {
        "bytes": stats["kv_bytes_per_token"],
        "per_gib": 1024**3 // stats["kv_bytes_per_token"],
        "calibration": stats.get("kv_calibration") or "-",
        "tokens": [o.token_ids for o in outs],
        "ppl": math.exp(-logprob / (len(ids) - 1)),
    }


def throughput(engine: Engine, args: argparse.Namespace) -> tuple[float, float]:
    """(decode tokens/s, few-shot tokens/s) of one run."""
    start = time.perf_counter()
    outs = engine.generate(prompts(args.prompts), max_new_tokens=args.tokens, temperature=0.0,
                           ignore_eos=True)  # fmt: skip
    decode = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)
    shots = [FEW_SHOT + f"Q: What is the capital of {c}?\nA:" for c in COUNTRIES]
    engine.generate(shots[:1], max_new_tokens=4, temperature=0.0)  # the prefix, cached
    start = time.perf_counter()
    few = engine.generate(shots, max_new_tokens=8, temperature=0.0, ignore_eos=True)
    return decode, sum(len(o.token_ids) for o in few) / (time.perf_counter() - start)


def agreement(ref: list[list[int]], got: list[list[int]]) -> tuple[float, float, float]:
    """Free-running greedy agreement: (share of equal tokens position by position, share of
    prompts equal throughout, mean share of a prompt's tokens before its first difference)."""
    same = sum(a == b for x, y in zip(ref, got, strict=True) for a, b in zip(x, y, strict=False))
    total = sum(len(x) for x in ref)
    whole = sum(x == y for x, y in zip(ref, got, strict=True))
    first = []
    for x, y in zip(ref, got, strict=True):
        n = next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), len(x))
        first.append(n / max(len(x), 1))
    return same / total, whole / len(ref), sum(first) / len(first)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engine.kv_quant", description=__doc__)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv", default="bf16,fp8_e4m3,fp8_e5m2")
    p.add_argument("--calibration", default="smooth", help="fp8 pools: smooth, scale or none")
    p.add_argument("--budget-gb", type=float, default=0.05)
    p.add_argument("--chat", action="store_true",
                   help="agreement on chat-templated prompts that stop at the model's end of "
                        "turn (default: raw prompts, ignore_eos)")  # fmt: skip
    args = p.parse_args()
    kvs = args.kv.split(",")
    load = [os.getloadavg()[0]]
    engines = {kv: open_engine(kv, args) for kv in kvs}
    try:
        acc = {kv: accuracy(engines[kv], args) for kv in kvs}
        runs: dict[str, list[tuple[float, float]]] = {kv: [] for kv in kvs}
        for _ in range(args.repeats):  # alternating: each dtype sees the same background load
            for kv in kvs:
                runs[kv].append(throughput(engines[kv], args))
                print(f"{kv}: decode {runs[kv][-1][0]:.1f} tok/s, few-shot {runs[kv][-1][1]:.1f} "
                      f"tok/s (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    finally:
        for e in engines.values():
            e.shutdown()
    load.append(os.getloadavg()[0])
    ref = acc[kvs[0]]
    speed = {kv: tuple(statistics.median(r[i] for r in runs[kv]) for i in (0, 1)) for kv in kvs}
    print(f"default model, weights bf16; {args.prompts} prompts x {args.tokens} tokens; "
          f"agreement and ratios against KV {kvs[0]}; throughput: median of {args.repeats} "
          f"alternating runs; load average {load[0]:.1f} at start, "
          f"{load[1]:.1f} at end")  # fmt: skip
    head = ("kv dtype", "calibration", "bytes/tok", "tokens/GiB", "equal tok (free-running)",
            "equal prompts", "first diff", "held-out ppl", "ppl vs ref", "decode tok/s",
            "few-shot tok/s")  # fmt: skip
    print(" | ".join(head))
    for kv in kvs:
        r, (dec, few) = acc[kv], speed[kv]
        tok, whole, first = agreement(ref["tokens"], r["tokens"])
        print(" | ".join([
            kv, r["calibration"], str(r["bytes"]), f"{r['per_gib']:,}", f"{tok:.1%}",
            f"{whole:.1%}", f"{first:.1%}", f"{r['ppl']:.3f}", f"{r['ppl'] / ref['ppl'] - 1:+.2%}",
            f"{dec:.1f} ({dec / speed[kvs[0]][0] - 1:+.0%})",
            f"{few:.1f} ({few / speed[kvs[0]][1] - 1:+.0%})",
        ]))  # fmt: skip


if __name__ == "__main__":
    main()
