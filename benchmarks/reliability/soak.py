"""Soak test of `runtime.server`: a mixed load from many clients, with faults, for minutes.

Run: .venv/bin/python -m benchmarks.reliability.soak [--minutes 10] [--clients 16] [--model PATH]
     [--topology server|replicas|pd|tp] [--fault-every S | --no-faults]
     [--warm-up-minutes 2] [--json FILE]

Each client sends requests one after another, of these kinds in turn (a client starts at its
own place in the list): plain chat (its latency is the one reported), streamed, streamed and
dropped after two chunks, JSON schema (response_format; the answer is validated unless cut by
max_tokens), regex, GBNF (`ebnf`), tools (a tool call parsed back), `n=2`, a client that gives
up after 50 ms (cancelled), a malformed body (must be a 4xx), and a pathological constraint
(`benchmarks.reliability.isolation`'s, must be answered: a 200 or a 4xx naming the limit).

Topologies and their faults (`benchmarks.reliability.topologies`): one server (a compile worker
killed), a 2-replica cluster (a replica killed), a prefill-decode cluster (a prefill server
killed while it has a request in flight), a `--tp 2` server (a tensor-parallel rank killed).
Every `--fault-every` seconds the victim is killed with SIGKILL; the next fault waits until the
topology is whole again (the time it took is reported).

The report: requests answered (2xx), refused (4xx), failed (5xx: those in flight when a process
was killed, and the others, which must be none), hung (no answer within `--hang-s`, none
allowed), cancelled on purpose; p50 / p99 latency of the plain requests; the serving
processes' resident memory (summed) after warm-up and at the end (a leak: more than 10 %
growth, each KV pool counted whole: its pages become resident as they are first written, so
the cache filling the pool is not growth); after `/flush_cache` on every server the pools'
used tokens (must be 0) and each engine's integrity check of the pool and radix tree; whether
the killed processes came back.
The warm-up (`--warm-up-minutes`, default 2: the full load with one fault at its middle) comes
before the memory baseline, and the report's `warm_up` says what it took (its requests, hangs,
fault, and the resident memory before and after it). The exit status is 1 when a hang, a 5xx
not in flight at a kill, a wrong answer, a leak, a failed check or a process not brought back
was seen.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import jsonschema

from benchmarks.reliability import topologies
from benchmarks.reliability.isolation import pathological_cases
from benchmarks.reliability.topologies import Topology
from benchmarks.serving.server import rss_mb, wait_idle

__all__ = ["soak"]

# ---- the load -------------------------------------------------------------------------------
KINDS = (
    "plain", "stream", "drop", "json", "regex", "gbnf", "tools", "n2", "plain", "cancel",
    "malformed", "json", "plain", "stream", "pathological",
)  # fmt: skip
RECORD = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}
GBNF = 'root ::= "The answer is " [0-9]+ "."'
QUESTIONS = ("Name one museum in Paris.", "Suggest a day trip from Berlin.", "Is Oslo expensive?")


@dataclass(slots=True)
class Tally:
    answered: int = 0
    refused: int = 0
    failed: int = 0
    hung: int = 0
    cancelled: int = 0
    wrong: list[str] = field(default_factory=list)  # answers that broke their contract
    failures: list[str] = field(default_factory=list)
    plain_s: list[float] = field(default_factory=list)
    by_kind: dict[str, int] = field(default_factory=dict)
    failed_spans: list[tuple[float, float]] = field(default_factory=list)  # (sent, answered)
    # the kinds a 4xx is right for (a PD cluster also refuses n > 1, naming it)
    refusable: tuple[str, ...] = ("malformed", "pathological")


def _body(kind: str, k: int) -> dict:
    q = QUESTIONS[k % len(QUESTIONS)]
    body: dict = {
        "messages": [{"role": "user", "content": f"{q} (request {k})"}],
        "max_tokens": 16,
        "temperature": 0.7,
        "seed": k,
    }
    if kind == "json":
        body["max_tokens"] = 48
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "trip", "schema": RECORD},
        }
    elif kind == "regex":
        body["regex"] = r"(yes|no), [0-9]{1,3} (km|days)"
    elif kind == "gbnf":
        body["ebnf"] = GBNF
    elif kind == "tools":
        body["max_tokens"] = 48
        body["tools"] = [TOOL]
        body["tool_choice"] = "required"
    elif kind == "n2":
        body["n"] = 2
    elif kind == "pathological":
        cases = list(pathological_cases().values())
        body.update(cases[k % len(cases)])
        body["max_tokens"] = 8
    return body


def _check_answer(kind: str, data: dict) -> str | None:
    """What is wrong with a 200 answer of `kind` (None: nothing)."""
    choices = data.get("choices") or []
    if len(choices) != (2 if kind == "n2" else 1):
        return f"{len(choices)} choices"
    ch = choices[0]
    if ch.get("finish_reason") not in ("stop", "length", "tool_calls"):
        return f"finish_reason {ch.get('finish_reason')}"
    text = ch["message"].get("content") or ""
    if kind == "json" and ch["finish_reason"] == "stop":
        try:
            jsonschema.validate(json.loads(text), RECORD)
        except (ValueError, jsonschema.ValidationError) as e:
            return f"json answer invalid: {e}"
    if kind == "tools" and ch["finish_reason"] == "tool_calls":
        calls = ch["message"].get("tool_calls") or []
        if not calls or calls[0]["function"]["name"] != "get_weather":
            return "tool call missing"
        json.loads(calls[0]["function"]["arguments"])
    return None


async def _stream(http: httpx.AsyncClient, body: dict, drop: bool) -> tuple[int, str | None]:
    body = {**body, "stream": True}
    chunks, finishes, done = 0, [], False
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, None
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                return 500, f"stream error event: {event['error']}"
            choice = event["choices"][0]
            chunks += bool(choice["delta"].get("content"))
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
            if drop and chunks >= 2:
                return 0, None  # leaving the block closes the connection mid-stream
    if not done or len(finishes) != 1:
        return 200, f"stream ended badly: done={done} finishes={finishes}"
    return 200, None


async def one_request(http: httpx.AsyncClient, kind: str, k: int, t: Tally, hang_s: float):
    t.by_kind[kind] = t.by_kind.get(kind, 0) + 1
    started = time.perf_counter()
    try:
        if kind == "malformed":
            r = await http.post(
                "/v1/chat/completions",
                content=b'{"messages": [',
                headers={"content-type": "application/json"},
                timeout=hang_s,
            )
            status, problem = r.status_code, None
        elif kind in ("stream", "drop"):
            status, problem = await asyncio.wait_for(
                _stream(http, _body(kind, k), kind == "drop"), hang_s
            )
            if status == 0:
                t.cancelled += 1
                return
        elif kind == "cancel":
            try:
                await http.post("/v1/chat/completions", json=_body(kind, k), timeout=0.05)
                status, problem = 200, None
            except httpx.TimeoutException:
                t.cancelled += 1
                return
        else:
            r = await http.post("/v1/chat/completions", json=_body(kind, k), timeout=hang_s)
            status = r.status_code
            problem = _check_answer(kind, r.json()) if status == 200 else None
            if status >= 500:
                problem = f"{kind}: {status} {r.text[:200]}"
            elif status >= 400 and kind not in t.refusable:
                problem = f"{kind}: refused with {status} {r.text[:200]}"
    except (TimeoutError, httpx.TimeoutException):
        t.hung += 1
        t.failures.append(f"{kind}: no answer within {hang_s} s")
        return
    except httpx.HTTPError as e:
        t.failed += 1
        t.failures.append(f"{kind}: {type(e).__name__}: {e}")
        t.failed_spans.append((started, time.perf_counter()))
        return
    if status >= 500:
        t.failed += 1
        t.failures.append(problem or f"{kind}: {status}")
        t.failed_spans.append((started, time.perf_counter()))
    elif status >= 400:
        t.refused += 1
        if kind not in t.refusable and not problem:
            t.wrong.append(f"{kind}: refused with {status}")
    else:
        t.answered += 1
        if kind == "malformed":
            t.wrong.append("malformed body answered with a 2xx")
        if kind == "plain":
            t.plain_s.append(time.perf_counter() - started)
    if problem and status < 500:
        t.wrong.append(problem)


async def run_load(url: str, minutes: float, clients: int, hang_s: float, t: Tally) -> None:
    deadline = time.monotonic() + minutes * 60
    limits = httpx.Limits(max_connections=clients * 2)
    async with httpx.AsyncClient(base_url=url, timeout=hang_s, limits=limits) as http:

        async def client(i: int) -> None:
            k = i
            while time.monotonic() < deadline:
                await one_request(http, KINDS[k % len(KINDS)], k, t, hang_s)
                k += clients

        await asyncio.gather(*(client(i) for i in range(clients)))


# ---- faults and checks ----------------------------------------------------------------------
async def inject_faults(topo: Topology, every_s: float, until: float) -> None:
    """Every `every_s`: kill the topology's victim, then wait until it is back (the next fault
    comes `every_s` after that)."""
    rng = random.Random(0)
    while time.monotonic() + every_s < until:
        await asyncio.sleep(every_s)
        fault = await asyncio.to_thread(topo.inject, rng)
        if fault is None:
            continue
        await asyncio.sleep(1.0)
        while time.monotonic() - fault.at < 600:
            if await asyncio.to_thread(topo.recovered):
                fault.back_after_s = round(time.monotonic() - fault.at, 1)
                break
            await asyncio.sleep(1.0)


def _at_a_fault(span: tuple[float, float], faults: list, grace_s: float = 2.0) -> bool:
    """Was the request in flight when a fault struck (sent before it, answered after)?"""
    return any(span[0] <= f.at + grace_s and span[1] >= f.at for f in faults)


def _settle(topo: Topology, timeout_s: float = 600) -> bool:
    """Wait until the topology is whole again and every server idle."""
    deadline = time.monotonic() + timeout_s
    while not topo.recovered():
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    for url, _ in topo.servers():
        wait_idle(url)
    return True


def _pools(topo: Topology) -> dict:
    """After `/flush_cache` on every server: their used pool tokens and integrity checks."""
    used, checks = 0, []
    for url, pid in topo.servers():
        flush = httpx.post(f"{url}/flush_cache", timeout=60).json()
        stats = httpx.get(f"{url}/stats", timeout=30).json()
        used += stats.get("pool_used_tokens") or 0
        checks.append(f"{topo.role(pid)}: {flush.get('integrity', 'not reported')}")
    ok = all(c.endswith((": ok", ": not reported")) for c in checks)
    return {"pool_used_tokens_after_flush": used, "integrity": "ok" if ok else checks,
            "integrity_per_server": checks}  # fmt: skip


def _rss(topo: Topology) -> float:
    return sum(rss_mb(pid) for _, pid in topo.servers())


def _kv_unheld_mb(topo: Topology) -> float:
    """MB of the serving processes' KV pools reserved but not yet resident (a pool's pages
    become resident as they are first written, runtime/memory/kv_pool.py: the radix cache
    filling the pool is growth up to what it reserved, not a leak). A `--tp` server's pool is
    in its ranks (not in `_rss`): none here."""
    unheld = 0
    for url, _ in topo.servers():
        try:
            stats = httpx.get(f"{url}/stats", timeout=30).json()
        except (httpx.HTTPError, ValueError):
            continue
        held = stats.get("kv_pool_resident_bytes")
        if held is not None:
            unheld += max(int(stats.get("kv_pool_bytes") or 0) - held, 0)
    return unheld / 2**20


def _rss_parts(topo: Topology) -> dict[str, list[float]]:
    """Resident MB per process: the serving processes, and beside them (not in `_rss`) a
    `--tp` server's ranks and the compile workers (the spare included)."""
    servers = [pid for _, pid in topo.servers()]
    workers = [w for pid in servers for w in topologies.children(pid, b"compile_worker.py")]
    ranks = topo.ranks() if topo.name == "tp" else []
    parts = {"serving": servers, "ranks": ranks, "compile workers": workers}
    return {k: [round(rss_mb(p), 1) for p in pids] for k, pids in parts.items()}


def _tally(topo: Topology) -> Tally:
    t = Tally()
    if topo.name == "pd":  # one generation per request there: n = 2 is a 400 naming it
        t.refusable += ("n2",)
    return t


async def warm_up(topo: Topology, args: argparse.Namespace) -> dict:
    """Before the memory baseline: every kind once and every pathological constraint once (their
    compiled forms and refusals are cached from then on), then `args.warm_up_minutes` of the
    full load (every client) with one fault at its middle, the topology brought back. Memory
    that the serving processes take once and keep is reached here, not counted as growth: the
    allocator's free lists at the batch sizes of that many clients (glibc keeps freed memory
    in its arenas), the automaton states and masks of the cached constraints built lazily as
    outputs visit them, and a restart's one-time cost. The report says what the warm-up took
    (`warm_up`), so nothing of it is hidden."""
    t = _tally(topo)
    rss_before = _rss(topo)
    n = len(pathological_cases())
    async with httpx.AsyncClient(base_url=topo.url, timeout=args.hang_s) as http:
        kinds = [(kind, k) for k, kind in enumerate(dict.fromkeys(KINDS))]
        kinds += [("pathological", k) for k in range(n)]
        await asyncio.gather(*(one_request(http, kind, k, t, args.hang_s) for kind, k in kinds))
    first_fault = len(topo.faults)
    minutes = args.warm_up_minutes
    jobs = [run_load(topo.url, minutes, args.clients, args.hang_s, t)]
    if args.fault_every > 0:  # one fault, at the middle
        jobs.append(inject_faults(topo, minutes * 30, time.monotonic() + minutes * 60))
    await asyncio.gather(*jobs)
    return {
        "minutes": minutes,
        "requests": t.answered + t.refused + t.failed + t.hung + t.cancelled,
        "failed_5xx": t.failed,
        "hung": t.hung,
        "n_wrong": len(t.wrong),
        "faults": [f"{f.what}: back after {f.back_after_s} s" for f in topo.faults[first_fault:]],
        "rss_before_mb": round(rss_before, 1),
    }


def soak(topo: Topology, args: argparse.Namespace) -> dict:
    warm = asyncio.run(warm_up(topo, args))
    _settle(topo)
    rss_start, parts_start = _rss(topo), _rss_parts(topo)
    unheld_start = _kv_unheld_mb(topo)
    warm["rss_after_mb"] = round(rss_start, 1)
    first_fault = len(topo.faults)
    pids_start = sorted(pid for _, pid in topo.servers())
    load_start = os.getloadavg()
    t = _tally(topo)

    async def load_and_faults() -> None:
        until = time.monotonic() + args.minutes * 60
        jobs = [run_load(topo.url, args.minutes, args.clients, args.hang_s, t)]
        if args.fault_every > 0:
            jobs.append(inject_faults(topo, args.fault_every, until))
        await asyncio.gather(*jobs)

    started = time.monotonic()
    asyncio.run(load_and_faults())
    took = time.monotonic() - started
    recovered = _settle(topo)
    rss_end, parts_end = _rss(topo), _rss_parts(topo)
    unheld_end = _kv_unheld_mb(topo)
    # the leak check counts each KV pool whole (as if written at start): its pages becoming
    # resident as the cache fills them is not growth
    whole_start, whole_end = rss_start + unheld_start, rss_end + unheld_end
    faults = topo.faults[first_fault:]
    at_fault = sum(_at_a_fault(span, faults) for span in t.failed_spans)
    q = sorted(t.plain_s)
    report = {
        "topology": topo.name,
        "minutes": round(took / 60, 2),
        "clients": args.clients,
        "load_average_start_end": [load_start, os.getloadavg()],
        "requests": t.answered + t.refused + t.failed + t.hung + t.cancelled,
        "answered_2xx": t.answered,
        "refused_4xx": t.refused,
        "failed_5xx": t.failed,
        "failed_in_flight_at_a_kill": at_fault,
        "failed_other": t.failed - at_fault,
        "hung": t.hung,
        "cancelled_on_purpose": t.cancelled,
        "wrong": t.wrong[:10],
        "n_wrong": len(t.wrong),
        "failures": t.failures[:10],
        "plain_p50_s": round(statistics.median(q), 3) if q else None,
        "plain_p99_s": round(q[min(len(q) - 1, int(len(q) * 0.99))], 3) if q else None,
        "rss_start_mb": round(rss_start, 1),
        "rss_end_mb": round(rss_end, 1),
        "rss_per_process_start_end_mb": [parts_start, parts_end],
        "kv_pool_not_yet_resident_start_end_mb": [round(unheld_start, 1), round(unheld_end, 1)],
        "rss_pool_whole_start_end_mb": [round(whole_start, 1), round(whole_end, 1)],
        "server_pids_start_end": [pids_start, sorted(pid for _, pid in topo.servers())],
        **_pools(topo),
        "faults": [f"{f.what}: back after {f.back_after_s} s" for f in faults],
        "recovered": recovered,
        "by_kind": t.by_kind,
        "warm_up": warm,
    }
    report["ok"] = (
        t.hung == 0
        and warm["hung"] == 0
        and not warm["n_wrong"]
        and report["failed_other"] == 0
        and not t.wrong
        and recovered
        and report["pool_used_tokens_after_flush"] == 0
        and report["integrity"] == "ok"
        and not (whole_end > whole_start * 1.10)
    )
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reliability.soak")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--model", default=None)
    p.add_argument("--topology", choices=topologies.TOPOLOGIES, default="server")
    p.add_argument(
        "--fault-every", type=float, default=None,
        help="seconds between faults (default: 30 on one server, 120 on the others)",
    )  # fmt: skip
    p.add_argument("--no-faults", dest="fault_every", action="store_const", const=0.0)
    p.add_argument(
        "--warm-up-minutes", type=float, default=2.0,
        help="full load (with one fault) before the memory baseline is read",
    )  # fmt: skip
    p.add_argument("--hang-s", type=float, default=120.0, help="no answer within: hung")
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag")
    p.add_argument("--json", default=None, help="write the report here too")
    args = p.parse_args(argv)
    if args.fault_every is None:
        args.fault_every = 30.0 if args.topology == "server" else 120.0
    topo = topologies.start(args.topology, args.model, args.server_arg)
    try:
        report = soak(topo, args)
    finally:
        topo.stop()
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
