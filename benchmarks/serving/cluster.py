"""Cache-aware vs round-robin routing over data-parallel replicas.

Run: .venv/bin/python -m benchmarks.serving.cluster [--model PATH] [--families 8] [--per-family 16]
     [--prefix-tokens 1000] [--max-tokens 4] [--concurrency 8] [--max-total-tokens 5120]

The workload: `families` prompt families, each a different ~`prefix-tokens`-token document
followed by one of `per-family` short questions; all requests shuffled (fixed seed) and sent
through the gateway by `concurrency` clients as /v1/completions. For each policy a fresh
cluster of `replicas` replicas is started (empty caches), the workload runs once, and the
replicas' /metrics give the cache hit rate: cached prompt tokens / prompt tokens, summed
over the replicas.

Each replica's KV pool is capped at `max-total-tokens` (0: the engine's default budget). With
the default cap one replica holds about five of the eight ~1,000-token prefixes: round-robin
sends every family to every replica, so each replica's cache churns through all of them,
while cache-aware routing keeps each family on one replica, so the two caches together hold
them all. Without the cap (--max-total-tokens 0) every replica keeps every prefix it has seen
and round-robin only pays one extra prefill per family and replica.
"""

from __future__ import annotations

import argparse
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from tqdm import tqdm

from runtime.cluster import Cluster, ClusterConfig

WORDS = (
    "river stone ledger harbor copper violet engine meadow signal lantern orbit canyon "
    "falcon quartz timber velvet garnet summit prairie beacon glacier cobalt willow ember "
    "mosaic anchor thistle harvest compass saffron ridge tundra marble cedar nimbus delta "
    "pepper raven silver fjord juniper basalt zephyr clover onyx pylon saddle tango"
).split()


@dataclass(slots=True)
class Outcome:
    policy: str
    requests: int
    failed: int
    seconds: float
    prompt_tokens: float
    cached_tokens: float
    per_replica: list[int]

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def family_prefix(tokenizer, family: int, target_tokens: int) -> str:
    """A document of about `target_tokens` tokens whose first words differ per family."""
    rng = random.Random(1000 + family)
    sentences: list[str] = [f"Archive {family}: notes on the {rng.choice(WORDS)} project."]
    while len(tokenizer(" ".join(sentences))["input_ids"]) < target_tokens:
        words = " ".join(rng.choice(WORDS) for _ in range(12))
        sentences.append(f"Entry {len(sentences)}: {words}.")
    return " ".join(sentences)


def workload(tokenizer, args: argparse.Namespace) -> list[str]:
    prompts = []
    for family in range(args.families):
        prefix = family_prefix(tokenizer, family, args.prefix_tokens)
        for q in range(args.per_family):
            prompts.append(f"{prefix}\nQuestion {q}: what is entry {q + 1} about?\nAnswer:")
    random.Random(0).shuffle(prompts)
    return prompts


def counter(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def answered(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    prefix = 'sgl_requests_total{endpoint="/v1/completions",status="200"} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return sum(int(float(line.split()[-1])) for line in lines)


def run_policy(policy: str, prompts: list[str], args: argparse.Namespace) -> Outcome:
    server_args = ["--num-threads", str(args.threads_per_replica)]
    if args.max_total_tokens:
        server_args += ["--max-total-tokens", str(args.max_total_tokens)]
    cluster = Cluster(
        ClusterConfig(
            replicas=args.replicas,
            model=args.model,
            policy=policy,
            port=0,
            server_args=server_args,
        )
    )
    cluster.start()
    try:
        model = httpx.get(f"{cluster.replicas[0].url}/v1/models").json()["data"][0]["id"]
        client = httpx.Client(base_url=cluster.router_url, timeout=600)

        def send(prompt: str) -> bool:
            body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens}
            body["temperature"] = 0
            return client.post("/v1/completions", json=body).status_code == 200

        started = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            results = list(tqdm(pool.map(send, prompts), total=len(prompts), desc=policy))
        seconds = time.perf_counter() - started
        urls = [r.url for r in cluster.replicas]
        return Outcome(
            policy=policy,
            requests=len(prompts),
            failed=results.count(False),
            seconds=seconds,
            prompt_tokens=sum(counter(u, "sgl_prompt_tokens_total") for u in urls),
            cached_tokens=sum(counter(u, "sgl_cached_prompt_tokens_total") for u in urls),
            per_replica=[answered(u) for u in urls],
        )
    finally:
        cluster.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--families", type=int, default=8)
    p.add_argument("--per-family", type=int, default=16)
    p.add_argument("--prefix-tokens", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-total-tokens", type=int, default=5120, help="per replica; 0: default")
    p.add_argument("--threads-per-replica", type=int, default=1)
    p.add_argument("--policies", nargs="+", default=["cache_aware", "round_robin"])
    args = p.parse_args()

    from transformers import AutoTokenizer

    from runtime.default_model import ensure_default_model

    model_dir = args.model or str(ensure_default_model())
    prompts = workload(AutoTokenizer.from_pretrained(model_dir), args)
    outcomes = [run_policy(policy, prompts, args) for policy in args.policies]

    pool = args.max_total_tokens or "default"
    print(
        f"\n{args.families} families x {args.per_family} requests, ~{args.prefix_tokens}-token "
        f"prefixes, max_tokens {args.max_tokens}, {args.concurrency} clients, "
        f"{args.replicas} replicas (KV pool {pool} tokens each)\n"
    )
    header = (
        f"{'policy':<12} {'hit rate':>8} {'req/s':>7} {'prompt tok/s':>12} {'wall s':>7} "
        f"{'failed':>6}  requests per replica"
    )
    print(header)
    print("-" * len(header))
    for o in outcomes:
        print(
            f"{o.policy:<12} {o.hit_rate:>8.1%} {o.requests / o.seconds:>7.2f} "
            f"{o.prompt_tokens / o.seconds:>12.0f} {o.seconds:>7.1f} {o.failed:>6}  "
            f"{o.per_replica}"
        )
    if len(outcomes) == 2 and outcomes[1].hit_rate > 0:
        a, b = outcomes
        print(
            f"\n{a.policy} / {b.policy}: hit rate x{a.hit_rate / b.hit_rate:.2f}, "
            f"throughput x{(b.seconds / a.seconds):.2f}"
        )


if __name__ == "__main__":
    main()
