"""Load check of `runtime.server`: many concurrent chat clients sharing a system prompt.

Run: .venv/bin/python -m benchmarks.serving.server [--model PATH] [--clients 64] [--requests 8]
     [--max-tokens 16] [--max-queue 256] [--max-running 64] [--url URL (a running server)]

Each client sends its requests one after another; request k (over all clients) is
  k % 16 == 7   streamed, and cancelled (connection closed) after its second content chunk
  k % 4 == 2    json_schema response_format (a small record), validated with jsonschema
  k % 2 == 1    streamed (OpenAI chunks until [DONE])
  otherwise     a plain chat completion
All share one long system prompt, so the radix cache should serve most prompt tokens.
"Answered correctly" means: status 200, exactly one final answer (a finish_reason, [DONE] for
streams), usage within max_tokens, and a json_schema answer that parses and validates (unless
cut by max_tokens). The server's RSS is read idle after start-up and warm-up, after the load
and after a second identical round (a leak would keep growing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import jsonschema

SYSTEM = (
    "You are a concise assistant for a travel company. Answer in one short sentence. "
    "Never invent prices. Prefer metric units. Be friendly but brief. " * 4
)
QUESTIONS = [
    "What is a good time to visit Kyoto?",
    "Name one museum in Paris.",
    "How far is Rome from Florence?",
    "What language is spoken in Lisbon?",
    "Suggest a day trip from Berlin.",
    "Is Oslo expensive?",
    "What is the currency of Japan?",
    "Recommend a dish to try in Madrid.",
]
RECORD = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 30},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


@dataclass
class Tally:
    sent: int = 0
    correct: int = 0
    wrong: int = 0
    busy_503: int = 0
    cancelled: int = 0
    json_valid: int = 0  # json_schema answers that parsed and validated
    json_cut: int = 0  # json_schema answers cut by max_tokens (a valid prefix)
    errors: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.wrong += 1
        self.errors[what] = self.errors.get(what, 0) + 1


def kind_of(k: int, json_ok: bool) -> str:
    if k % 16 == 7:
        return "cancel"
    if k % 4 == 2:
        return "json" if json_ok else "plain"
    return "stream" if k % 2 == 1 else "plain"


async def one_request(http: httpx.AsyncClient, k: int, args, tally: Tally, json_ok: bool) -> None:
    kind = kind_of(k, json_ok)
    body = {
        "model": args.model_name,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{QUESTIONS[k % len(QUESTIONS)]} (request {k})"},
        ],
        "max_tokens": args.max_tokens if kind != "json" else args.max_tokens * 3,
        "temperature": 0,
    }
    if kind == "json":
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "trip", "schema": RECORD},
        }
    tally.sent += 1
    started = time.perf_counter()
    if kind in ("stream", "cancel"):
        body["stream"] = True
        finishes, done, chunks = [], False, 0
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code == 503:
                tally.busy_503 += 1
                return
            if r.status_code != 200:
                tally.error(f"status {r.status_code}")
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                event = json.loads(line[6:])
                if "error" in event:
                    tally.error("stream error event")
                    return
                choice = event["choices"][0]
                if choice["delta"].get("content"):
                    if chunks == 0:
                        tally.ttfts.append(time.perf_counter() - started)
                    chunks += 1
                if choice["finish_reason"]:
                    finishes.append(choice["finish_reason"])
                if kind == "cancel" and chunks >= 2:
                    tally.cancelled += 1
                    return  # leaving the block closes the connection mid-stream
        if kind == "cancel" and len(finishes) == 1 and done:
            tally.cancelled += 1  # it finished before two chunks: nothing to cancel
            return
        if done and len(finishes) == 1 and finishes[0] in ("stop", "length"):
            tally.correct += 1
            tally.latencies.append(time.perf_counter() - started)
        else:
            tally.error(f"stream ended badly: done={done} finishes={finishes}")
        return
    r = await http.post("/v1/chat/completions", json=body)
    if r.status_code == 503:
        tally.busy_503 += 1
        return
    if r.status_code != 200:
        tally.error(f"status {r.status_code}: {r.text[:80]}")
        return
    out = r.json()
    choice, usage = out["choices"][0], out["usage"]
    ok = (
        len(out["choices"]) == 1
        and choice["finish_reason"] in ("stop", "length")
        and usage["completion_tokens"] <= body["max_tokens"]
        and "cached_tokens" in usage["prompt_tokens_details"]
    )
    if ok and kind == "json" and choice["finish_reason"] == "stop":
        try:
            jsonschema.validate(json.loads(choice["message"]["content"]), RECORD)
            tally.json_valid += 1
        except (ValueError, jsonschema.ValidationError):
            ok = False
    elif ok and kind == "json":
        tally.json_cut += 1
    if ok:
        tally.correct += 1
        tally.latencies.append(time.perf_counter() - started)
    else:
        tally.error(f"bad answer ({kind})")


async def run_round(args, json_ok: bool) -> tuple[Tally, float]:
    tally = Tally()
    limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(base_url=args.url, timeout=600, limits=limits) as http:

        async def client(i: int) -> None:
            for j in range(args.requests):
                await one_request(http, i * args.requests + j, args, tally, json_ok)

        started = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(args.clients)))
        return tally, time.perf_counter() - started


def rss_mb(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait_idle(url: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = httpx.get(f"{url}/stats", timeout=30).json()
        if stats["running"] == 0 and stats["waiting"] == 0 and stats["server_in_flight"] == 0:
            return stats
        if time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def start_server(args) -> subprocess.Popen:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args.url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "runtime.server",
        "--port",
        str(port),
        "--max-queue",
        str(args.max_queue),
        "--max-running-requests",
        str(args.max_running),
        "--log-level",
        "warning",
    ]
    if args.model:
        cmd += ["--model", args.model]
    if args.num_threads:
        cmd += ["--num-threads", str(args.num_threads)]
    log = tempfile.NamedTemporaryFile(prefix="bench-server-", suffix=".log", delete=False)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited: {Path(log.name).read_text()[-2000:]}")
        try:
            if httpx.get(f"{args.url}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("server did not start")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def report(name: str, tally: Tally, wall: float, hit_rate: float) -> list[tuple[str, str]]:
    return [
        ("round", name),
        ("requests sent", str(tally.sent)),
        ("answered correctly", str(tally.correct)),
        ("refused (503)", str(tally.busy_503)),
        ("cancelled mid-stream", str(tally.cancelled)),
        ("json_schema: valid / cut", f"{tally.json_valid} / {tally.json_cut}"),
        ("wrong / failed", f"{tally.wrong} {tally.errors or ''}"),
        (
            "unaccounted",
            str(tally.sent - tally.correct - tally.busy_503 - tally.cancelled - tally.wrong),
        ),
        ("wall time (s)", f"{wall:.1f}"),
        ("requests/s (answered)", f"{tally.correct / wall:.2f}"),
        (
            "latency p50 / p99 (s)",
            f"{pct(tally.latencies, 0.5):.2f} / {pct(tally.latencies, 0.99):.2f}",
        ),
        ("TTFT p50 / p99 (s)", f"{pct(tally.ttfts, 0.5):.2f} / {pct(tally.ttfts, 0.99):.2f}"),
        (
            "mean latency (s)",
            f"{statistics.fmean(tally.latencies):.2f}" if tally.latencies else "nan",
        ),
        ("cache hit rate (prefill)", f"{hit_rate:.1%}"),
    ]


def hit_rate(before: dict, after: dict) -> float:
    hit = after["cache_hit_tokens"] - before["cache_hit_tokens"]
    computed = after["prefill_computed_tokens"] - before["prefill_computed_tokens"]
    return hit / (hit + computed) if hit + computed else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model folder (default model when omitted)")
    p.add_argument("--url", default=None, help="use a running server instead of starting one")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-queue", type=int, default=256)
    p.add_argument("--max-running", type=int, default=64, help="--max-running-requests")
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    proc = None if args.url else start_server(args)
    pid = proc.pid if proc else None
    try:
        info = httpx.get(f"{args.url}/v1/models").json()["data"][0]
        args.model_name = info["id"]
        rss_start = rss_mb(pid)
        probe = httpx.post(
            f"{args.url}/v1/chat/completions",
            timeout=600,
            json={
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "t", "schema": RECORD},
                },
            },
        )
        json_ok = probe.status_code == 200
        if not json_ok:
            print(f"json_schema unavailable ({probe.status_code}): those requests run plain")
        wait_idle(args.url)
        rss_idle = rss_mb(pid)
        rows: list[list[tuple[str, str]]] = []
        rss_after = []
        for i in range(args.rounds):
            before = wait_idle(args.url)
            tally, wall = asyncio.run(run_round(args, json_ok))
            after = wait_idle(args.url)
            rows.append(report(str(i + 1), tally, wall, hit_rate(before, after)))
            rows[-1].append(("engine pool used after (tokens)", str(after["pool_used_tokens"])))
            rows[-1].append(("  of which radix cache", str(after["cached_tokens"])))
            rss_after.append(rss_mb(pid))
            rows[-1].append(("server RSS after (MiB)", f"{rss_after[-1]:.0f}"))
            # the pool becomes resident as it is written (runtime/memory/kv_pool.py)
            held = after.get("kv_pool_resident_bytes")
            rows[-1].append(("  of which KV pool (MiB)",
                             "-" if held is None else f"{held / 2**20:.0f}"))  # fmt: skip
    finally:
        if proc is not None:
            proc.terminate()
            code = proc.wait(60)
            print(f"server exit status after SIGTERM: {code}")
    print(
        f"\nmodel {args.model_name}, {args.clients} clients x {args.requests} requests, "
        f"max_tokens {args.max_tokens} (json: x3), {os.cpu_count()} CPUs"
    )
    print(f"server RSS: {rss_start:.0f} MiB at start, {rss_idle:.0f} MiB idle after warm-up")
    width = max(len(k) for k, _ in rows[0])
    for i, (key, _) in enumerate(rows[0]):
        print(f"| {key:<{width}} | " + " | ".join(f"{r[i][1]:>14}" for r in rows) + " |")


if __name__ == "__main__":
    main()
