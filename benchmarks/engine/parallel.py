"""Tensor, pipeline and expert parallelism on this machine: memory per rank, throughput,
output equality and communication time, side by side in one run.

Run: .venv/bin/python -m benchmarks.engine.parallel [--quick]

Workload (greedy, fp32): a few-shot prompt (a shared prefix of question/answer pairs) with
Q questions behind it, 16 new tokens each, in one `generate` call after a warm-up. Models:
SmolLM2-135M-Instruct (tp 1, tp 3, pp 2) and a tiny random DeepSeek-V3-shaped MoE model (ep 1,
ep 2). Each configuration runs its ranks as processes with one thread each (the single-process
engine too, for a fair comparison), so on 2 cores the ranks compete for the CPU.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from runtime import Engine
from tests.support.tiny_models import make_tiny_model

PAIRS = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Kenya", "Nairobi"),
         ("Peru", "Lima"), ("Egypt", "Cairo"), ("Norway", "Oslo"),
         ("Chile", "Santiago")]  # fmt: skip
ASK = ["Spain", "Canada", "Greece", "Poland", "Cuba", "Ghana", "Nepal", "Iran", "Iraq", "Chad",
       "Mali", "Laos", "Fiji", "Oman", "Peru", "Togo"]  # fmt: skip


def prompts(questions: int, shots: int) -> list[str]:
    prefix = "Answer with the capital city.\n\n" + "".join(
        f"Q: What is the capital of {c}?\nA: {a}\n\n" for c, a in (PAIRS * 8)[:shots]
    )
    return [prefix + f"Q: What is the capital of {c}?\nA:" for c in ASK[:questions]]


def run(model: str | None, sizes: dict, batch: list[str]) -> dict:
    kwargs = dict(page_size=16, num_threads=1, **sizes)
    with Engine(model, **kwargs) as e:
        e.generate(batch[:1], max_new_tokens=2)  # warm-up (and the prefix into the cache)
        before = e.stats()
        start = time.perf_counter()
        out = e.generate(batch, max_new_tokens=16, min_new_tokens=16, temperature=0.0)
        seconds = time.perf_counter() - start
        stats = e.stats()
        steps = stats["forward_steps"] - before["forward_steps"]
        comm = e.model.comm_seconds() if e.parallel else [0.0]
        if e.parallel:
            weights = e.model.reports
        else:
            experts = e.model.expert_bytes() if hasattr(e.model, "expert_bytes") else 0
            weights = [{"weight_bytes": e.model.weight_bytes(), "expert_bytes": experts}]
    return {
        "tokens": [r.token_ids for r in out],
        "seconds": seconds,
        "tok_s": sum(len(r.token_ids) for r in out) / seconds,
        "weight_bytes_per_rank": max(r["weight_bytes"] for r in weights),
        "expert_bytes_per_rank": max(r["expert_bytes"] for r in weights),
        "kv_per_rank": stats["kv_bytes_per_token_per_rank"],
        "kv_whole": stats["kv_bytes_per_token"],
        "ranks": max(len(stats["worker_pids"]), 1),
        "comm_ms_per_step": 1000 * max(comm) / max(steps, 1) if steps else 0.0,
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 questions, a shorter prefix")
    args = parser.parse_args(argv)
    batch = prompts(4, 8) if args.quick else prompts(8, 24)
    torch.set_num_threads(1)
    moe = make_tiny_model(
        Path(tempfile.mkdtemp(prefix="bench-par-")) / "moe",
        "deepseek_v3",
        moe_intermediate_size=512,
    )
    plan = [
        ("SmolLM2-135M", None, {}),
        ("SmolLM2-135M", None, {"tp_size": 3}),
        ("SmolLM2-135M", None, {"pp_size": 2}),
        ("tiny DeepSeek-V3 MoE", str(moe), {}),
        ("tiny DeepSeek-V3 MoE", str(moe), {"ep_size": 2}),
    ]
    rows, base = [], {}
    for name, model, sizes in plan:
        r = run(model, sizes, batch)
        ref = base.setdefault(name, r)
        rows.append((name, sizes, r, ref))
    print(f"Few-shot: {len(batch)} questions, 16 new tokens each, fp32, one thread per rank\n")
    print("| model | parallel | ranks | weights/rank (MB) | share of whole | routed experts/rank "
          "(MB) | KV bytes/token/rank | share of whole | tok/s | vs 1 rank | comm ms/step | "
          "outputs equal |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, sizes, r, ref in rows:
        label = ", ".join(f"{k.split('_')[0]}={v}" for k, v in sizes.items()) or "none"
        print(f"| {name} | {label} | {r['ranks']} | {r['weight_bytes_per_rank'] / 1e6:.1f} | "
              f"{r['weight_bytes_per_rank'] / ref['weight_bytes_per_rank']:.2f} | "
              f"{r['expert_bytes_per_rank'] / 1e6:.2f} | "
              f"{r['kv_per_rank']:,} | {r['kv_per_rank'] / r['kv_whole']:.2f} | "
              f"{r['tok_s']:.1f} | {r['tok_s'] / ref['tok_s']:.2f}x | "
              f"{r['comm_ms_per_step']:.1f} | {r['tokens'] == ref['tokens']} |")  # fmt: skip


if __name__ == "__main__":
    main()
