"""Prefill-decode disaggregation vs plain replicas under a mixed workload.

Run: .venv/bin/python -m benchmarks.serving.pd [--model PATH] [--short 6] [--short-tokens 96]
     [--long 4] [--long-tokens 2000] [--rounds 2]

The workload: `short` chat requests stream `short-tokens` tokens each (ignore_eos) while
`long` requests with ~`long-tokens`-token prompts (each different, so nothing is cached)
arrive one per second and ask for 4 tokens; every request has its own system message (as
different users' requests do), so the cache-aware gateway spreads the plain replicas' work by
load rather than keeping all the short requests on one. Both run through the SGLang Model Gateway on
one machine, in the same number of server processes (two, each with `--threads-per-server`
torch threads):

- pd:    `runtime.cluster --prefill 1 --decode 1` (the gateway in PD mode)
- plain: `runtime.cluster --replicas 2 --policy cache_aware`

Measured at the client: the inter-token latency of the short requests (time between stream
events carrying tokens; p50 / p99 over every gap of every request), and the time to first
token of the long requests. For PD, the transfer time per 1,000 tokens of KV comes from both
servers' counters (`kv_transfer_s`: from the room's first frame to the acknowledgement, the
wait for the prefill excluded).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from dataclasses import dataclass, field

import httpx

from runtime.cluster import Cluster, ClusterConfig

WORDS = (
    "river stone ledger harbor copper violet engine meadow signal lantern orbit canyon "
    "falcon quartz timber velvet garnet summit prairie beacon glacier cobalt willow ember"
).split()


@dataclass(slots=True)
class Outcome:
    setup: str
    gaps: list[float] = field(default_factory=list)  # short requests' inter-token gaps (s)
    ttft: list[float] = field(default_factory=list)  # long requests' time to first token (s)
    failed: int = 0
    transfer: dict[str, float] = field(default_factory=dict)


def long_prompt(tokenizer, index: int, target: int) -> str:
    rng = random.Random(index)
    parts = [f"Report {index}: a review of the {rng.choice(WORDS)} survey."]
    while len(tokenizer(" ".join(parts)).input_ids) < target:
        parts.append(f"Line {len(parts)}: " + " ".join(rng.choice(WORDS) for _ in range(12)))
    return " ".join(parts) + "\nSummarise the report in one word:"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def stream_chat(url: str, model: str, system: str, content: str, max_tokens: int) -> list[float]:
    """Arrival times of the stream events that carried content. Every request has its own
    system message, as different users' requests do: no two share more than the template's
    first tokens, so the cache-aware gateway spreads them by load, not by prefix."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
    body = {"model": model, "messages": messages, "stream": True, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    times = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            raise RuntimeError(f"status {r.status_code}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices", []):
                if (choice.get("delta") or {}).get("content"):
                    times.append(time.perf_counter())
    return times


def run_setup(setup: str, long_prompts: list[str], args: argparse.Namespace) -> Outcome:
    server_args = ["--num-threads", str(args.threads_per_server)]
    config = ClusterConfig(model=args.model, port=0, server_args=server_args,
                           policy="cache_aware")  # fmt: skip
    if setup == "pd":
        config.prefill, config.decode = 1, 1
    else:
        config.replicas = 2
    cluster = Cluster(config)
    cluster.start()
    out = Outcome(setup)
    lock = threading.Lock()
    try:
        url = cluster.router_url
        model = httpx.get(f"{cluster.replicas[0].url}/v1/models").json()["data"][0]["id"]
        stream_chat(url, model, "Be brief.", "Warm up.", 4)  # first requests pay one-time costs
        for rnd in range(args.rounds):

            def short(i: int, rnd: int = rnd) -> None:
                try:
                    system = f"{WORDS[(i + 7 * rnd) % len(WORDS)].title()} is your name."
                    t = stream_chat(url, model, system, f"Round {rnd}, friend {i}: a story.",
                                    args.short_tokens)  # fmt: skip
                    with lock:
                        out.gaps.extend(b - a for a, b in zip(t, t[1:], strict=False))
                except Exception:
                    with lock:
                        out.failed += 1

            def long(prompt: str) -> None:
                start = time.perf_counter()
                try:
                    t = stream_chat(url, model, "Summarise.", prompt, 4)
                    with lock:
                        out.ttft.append((t[0] if t else time.perf_counter()) - start)
                except Exception:
                    with lock:
                        out.failed += 1

            threads = [threading.Thread(target=short, args=(i,)) for i in range(args.short)]
            for t in threads:
                t.start()
            time.sleep(1.0)  # the short requests are decoding
            longs = long_prompts[rnd * args.long : (rnd + 1) * args.long]
            for prompt in longs:
                t = threading.Thread(target=long, args=(prompt,))
                t.start()
                threads.append(t)
                time.sleep(args.long_interval)
            for t in threads:
                t.join()
        if setup == "pd":
            for r in cluster.replicas:
                info = httpx.get(f"{r.url}/stats", timeout=30).json()
                tokens = info["kv_transfer_bytes"] / info["kv_bytes_per_token"]
                if tokens:
                    out.transfer[r.role] = info["kv_transfer_s"] / tokens * 1000
                out.transfer[f"{r.role}_requests"] = info["kv_transfer_requests"]
        return out
    finally:
        cluster.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--short", type=int, default=6, help="short streaming requests per round")
    p.add_argument("--short-tokens", type=int, default=96)
    p.add_argument("--long", type=int, default=4, help="long-prompt requests per round")
    p.add_argument("--long-tokens", type=int, default=2000)
    p.add_argument("--long-interval", type=float, default=1.0, help="seconds between them")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads-per-server", type=int, default=1)
    p.add_argument("--setups", nargs="+", default=["plain", "pd"])
    args = p.parse_args()

    from transformers import AutoTokenizer

    from runtime.default_model import ensure_default_model

    model_dir = args.model or str(ensure_default_model())
    tok = AutoTokenizer.from_pretrained(model_dir)
    longs = [long_prompt(tok, i, args.long_tokens) for i in range(args.long * args.rounds)]
    outcomes = [run_setup(s, longs, args) for s in args.setups]

    print(
        f"\n{args.short} short chat streams x {args.short_tokens} tokens while {args.long} "
        f"~{args.long_tokens}-token prompts arrive ({args.long_interval:g} s apart), "
        f"{args.rounds} rounds, 2 server processes x {args.threads_per_server} thread(s)\n"
    )
    print("| setup | short ITL p50 (ms) | short ITL p99 (ms) | short ITL mean (ms) | "
          "long TTFT p50 (s) | long TTFT max (s) | failed |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for o in outcomes:
        name = "1 prefill + 1 decode (PD)" if o.setup == "pd" else "2 replicas (cache_aware)"
        print(
            f"| {name} | {percentile(o.gaps, 0.5) * 1e3:.1f} | {percentile(o.gaps, 0.99) * 1e3:.1f}"
            f" | {statistics.fmean(o.gaps) * 1e3 if o.gaps else float('nan'):.1f}"
            f" | {percentile(o.ttft, 0.5):.2f} | {max(o.ttft, default=float('nan')):.2f}"
            f" | {o.failed} |"
        )
    for o in outcomes:
        if o.transfer:
            print(
                f"\nKV transfer per 1,000 tokens (first frame to acknowledgement): "
                f"{o.transfer.get('prefill', 0) * 1e3:.1f} ms measured by the prefill server, "
                f"{o.transfer.get('decode', 0) * 1e3:.1f} ms by the decode server; rooms moved: "
                f"{o.transfer.get('prefill_requests', 0):.0f}"
            )
    if len(outcomes) == 2:
        a, b = outcomes
        ratio = percentile(a.gaps, 0.99) / percentile(b.gaps, 0.99)
        print(f"\nshort ITL p99, {a.setup} / {b.setup}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
