"""The storage tier under the radix cache on multi-turn agent sessions, and the PD KV transfer
with each transfer backend.

Run: .venv/bin/python -m benchmarks.serving.hicache [--model PATH] [--sessions 32] [--turns 8]
     [--turn-tokens 64] [--pool-ratio 6] [--repeats 1] [--pd-prompts 6] [--pd-tokens 1000]

Sessions: each of `sessions` agents has its own system prompt and, every turn, appends a user
message of ~`turn-tokens` tokens and the model's answer (`answer-tokens`, greedy) to its history;
the turns go round-robin over the sessions, as concurrent users' turns interleave. The KV pool
holds 1 / `pool-ratio` of the sessions' final histories, so by the time a session speaks again
its history has been evicted from the pool:

- radix:        the radix cache alone recomputes the evicted history every turn;
- radix + file: `enable_hierarchical_cache` with the file backend (a fresh folder, cold) loads
  it back from the files written when it was evicted;
- radix + mooncake (with `--mooncake-master HOST:PORT`, a running `mooncake_master`): the same
  tier over Mooncake Store, the engine lending the store 1 GiB (cold: its objects go with it).

Measured in-process: time to first token per turn (a streamed request's first chunk), p50 and
p99, and the wall time of all turns; the two setups' outputs must be equal token for token.
The setups alternate `repeats` times (the machine is shared); the table shows medians.

PD: a prefill and a decode engine in this process move `pd-prompts` prompts of ~`pd-tokens`
tokens over loopback with `disaggregation_transfer_backend` tcp and mooncake (when installed);
per 1,000 tokens of KV: the wire (the decode side's `kv_transfer_s`: from the first page to
the acknowledgement, the wait for the prefill and for pool pages excluded), the copies
(`kv_transfer_copy_s` of both sides: tcp copies the pages out of the prefill pool and into the
decode pool; mooncake reads pool to pool and copies nothing), and their sum.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from runtime import Engine

WORDS = (
    "river stone ledger harbor copper violet engine meadow signal lantern orbit canyon "
    "falcon quartz timber velvet garnet summit prairie beacon glacier cobalt willow ember"
).split()


@dataclass(slots=True)
class Run:
    setup: str
    ttft: list[float] = field(default_factory=list)
    wall: float = 0.0
    outputs: list[list[int]] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def user_turn(session: int, turn: int, tokens: int) -> list[int]:
    """A user message of `tokens` token ids, different for every session and turn (ids of
    common words, so any tokenizer's vocabulary has them: 100 .. 3100)."""
    base = 100 + (session * 7919 + turn * 104729) % 3000
    return [100 + (base + i * 37) % 3000 for i in range(tokens)]


def run_sessions(setup: str, args: argparse.Namespace, pool_tokens: int, folder: str) -> Run:
    kw: dict = dict(max_total_tokens=pool_tokens, page_size=args.page_size)
    if setup == "radix + file":
        shutil.rmtree(folder, ignore_errors=True)
        kw.update(enable_hierarchical_cache=True, hicache_storage_dir=folder)
    if setup == "radix + mooncake":
        extra = {"master_server_address": args.mooncake_master, "global_segment_size": "1gb",
                 "local_hostname": "127.0.0.1"}  # fmt: skip
        kw.update(enable_hierarchical_cache=True, hicache_storage_backend="mooncake",
                  hicache_storage_backend_extra_config=extra)  # fmt: skip
    out = Run(setup)
    with Engine(args.model, **kw) as engine:
        histories = [user_turn(s, -1, args.system_tokens) for s in range(args.sessions)]
        engine.generate(histories[0][:32], max_new_tokens=1)  # one-time costs
        start = time.perf_counter()
        for turn in range(args.turns):
            for s in range(args.sessions):
                histories[s] += user_turn(s, turn, args.turn_tokens)
                t0 = time.perf_counter()
                stream = engine.generate(
                    histories[s], stream=True, temperature=0.0,
                    max_new_tokens=args.answer_tokens, ignore_eos=True,
                )  # fmt: skip
                first = None
                for chunk in stream:
                    if first is None and chunk.token_ids:
                        first = time.perf_counter() - t0
                    if chunk.finished:
                        ids = chunk.result.token_ids
                out.ttft.append(first if first is not None else time.perf_counter() - t0)
                out.outputs.append(ids)
                histories[s] += ids
        out.wall = time.perf_counter() - start
        out.stats = engine.stats()
    return out


def pd_transfer(args: argparse.Namespace, backend: str) -> tuple[float, float]:
    """Seconds per 1,000 tokens of KV with `backend`: on the wire (decode side), and copying
    pages out of and into the pools (both sides)."""
    kw = dict(page_size=args.page_size, disaggregation_timeout_s=120,
              disaggregation_transfer_backend=backend)  # fmt: skip
    rooms = itertools.count(1)
    with (
        Engine(args.model, disaggregation_mode="prefill", disaggregation_bootstrap_port=0,
               disaggregation_bootstrap_host="127.0.0.1", **kw) as pre,
        Engine(args.model, disaggregation_mode="decode", **kw) as dec,
    ):  # fmt: skip
        for i in range(args.pd_prompts):
            prompt = user_turn(1000 + i, 0, args.pd_tokens)
            boot = dict(bootstrap_host="127.0.0.1", bootstrap_room=next(rooms),
                        bootstrap_port=pre.disaggregation.bootstrap_port)  # fmt: skip
            t = threading.Thread(target=pre.generate, args=(prompt,),
                                 kwargs=dict(max_new_tokens=2, **boot))  # fmt: skip
            t.start()
            dec.generate(prompt, max_new_tokens=2, **boot)
            t.join()
        s, p = dec.stats(), pre.stats()
    tokens = s["kv_transfer_bytes"] / s["kv_bytes_per_token"]
    copies = s["kv_transfer_copy_s"] + p["kv_transfer_copy_s"]
    return s["kv_transfer_s"] / tokens * 1000, copies / tokens * 1000


def mooncake_installed() -> bool:
    try:
        import mooncake.engine  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--system-tokens", type=int, default=96)
    p.add_argument("--turn-tokens", type=int, default=64)
    p.add_argument("--answer-tokens", type=int, default=8)
    p.add_argument("--pool-ratio", type=float, default=6.0,
                   help="the sessions' final KV / the pool's capacity")  # fmt: skip
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1, help="alternations of the two setups")
    p.add_argument("--pd-prompts", type=int, default=6)
    p.add_argument("--pd-tokens", type=int, default=1000)
    p.add_argument("--pd-backends", nargs="+", default=["tcp", "mooncake"])
    p.add_argument("--skip", nargs="*", default=[], choices=["sessions", "pd"])
    p.add_argument("--mooncake-master", default=None,
                   help="host:port of a running mooncake_master: adds radix + mooncake")
    args = p.parse_args()
    print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
    final = args.system_tokens + args.turns * (args.turn_tokens + args.answer_tokens)
    pool_tokens = int(args.sessions * final / args.pool_ratio)
    if "sessions" not in args.skip:
        folder = tempfile.mkdtemp(prefix="hicache-bench-")
        runs: dict[str, list[Run]] = {"radix": [], "radix + file": []}
        if args.mooncake_master:
            runs["radix + mooncake"] = []
        try:
            for _ in range(args.repeats):
                for setup in runs:
                    runs[setup].append(run_sessions(setup, args, pool_tokens, folder))
                    print(f"  {setup}: {runs[setup][-1].wall:.1f} s", file=sys.stderr)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        report_sessions(args, runs, final, pool_tokens)
    if "pd" not in args.skip:
        backends = [b for b in args.pd_backends if b != "mooncake" or mooncake_installed()]
        per_k: dict[str, list[tuple[float, float]]] = {b: [] for b in backends}
        for _ in range(args.repeats):
            for b in backends:
                per_k[b].append(pd_transfer(args, b))
                wire, copies = per_k[b][-1]
                print(f"  pd {b}: wire {wire * 1e3:.1f} + copies {copies * 1e3:.1f} ms / 1k "
                      "tokens", file=sys.stderr)  # fmt: skip
        print(f"\nPD KV transfer, {args.pd_prompts} prompts x ~{args.pd_tokens} tokens over "
              "loopback, ms per 1,000 tokens of KV (wire: decode side, first page to "
              "acknowledgement; copies: out of the prefill pool and into the decode pool); "
              f"median of {args.repeats}:\n")  # fmt: skip
        print("| transfer backend | wire | copies | wire + copies | runs (wire + copies) |")
        print("|---|---:|---:|---:|---|")
        for b, values in per_k.items():
            med = statistics.median
            runs = ", ".join(f"{(w + c) * 1e3:.1f}" for w, c in values)
            print(f"| {b} | {med(w for w, _ in values) * 1e3:.1f} | "
                  f"{med(c for _, c in values) * 1e3:.1f} | "
                  f"{med(w + c for w, c in values) * 1e3:.1f} | {runs} |")  # fmt: skip
        if "mooncake" in args.pd_backends and "mooncake" not in per_k:
            print("\n(mooncake: not installed here)")
    print(f"load: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")


def report_sessions(
    args: argparse.Namespace, runs: dict[str, list[Run]], final: int, pool_tokens: int
) -> None:
    a = runs["radix"]
    equal = all(x.outputs == y.outputs for rs in runs.values() for x, y in zip(a, rs, strict=True))
    print(
        f"\n{args.sessions} sessions x {args.turns} turns (+{args.turn_tokens} user, "
        f"+{args.answer_tokens} answer tokens a turn; final history {final} tokens); pool "
        f"{pool_tokens} tokens = 1/{args.pool_ratio:g} of the sessions' KV; median of "
        f"{args.repeats} alternation(s); outputs equal: {equal}\n"
    )
    print("| setup | TTFT p50 (ms) | TTFT p99 (ms) | wall (s) | prompt tokens computed | "
          "hit tokens pool / storage | pages written / loaded |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, rs in runs.items():
        med = statistics.median
        s = rs[-1].stats
        print(
            f"| {name} | {med(percentile(r.ttft, 0.5) for r in rs) * 1e3:.0f}"
            f" | {med(percentile(r.ttft, 0.99) for r in rs) * 1e3:.0f}"
            f" | {med(r.wall for r in rs):.1f} | {s['prefill_computed_tokens']}"
            f" | {s.get('cache_hit_tokens_device', s['cache_hit_tokens'])} / "
            f"{s.get('cache_hit_tokens_storage', 0)}"
            f" | {s.get('hicache_pages_written', 0)} / {s.get('hicache_pages_loaded', 0)} |"
        )
    for name, rs in runs.items():
        if rs is not a:
            ratio = statistics.median(percentile(r.ttft, 0.5) for r in a) / statistics.median(
                percentile(r.ttft, 0.5) for r in rs
            )
            print(f"\nTTFT p50, radix / {name}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
