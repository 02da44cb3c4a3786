"""Soak test of `runtime.server`: a mixed load from many clients, with faults, for minutes.

Run: .venv/bin/python -m benchmarks.soak [--minutes 10] [--clients 16] [--model PATH]
     [--url URL (a running server; no faults on its processes)] [--no-faults] [--json FILE]

Each client sends requests one after another, of these kinds in turn (a client starts at its
own place in the list): plain chat (its latency is the one reported), streamed, streamed and
dropped after two chunks, JSON schema (response_format; the answer is validated unless cut by
max_tokens), regex, GBNF (`ebnf`), tools (a tool call parsed back), `n=2`, a client that gives
up after 50 ms (cancelled), a malformed body (must be a 4xx), and a pathological constraint
(`benchmarks.isolation`'s, must be answered: a 200 or a 4xx naming the limit).

Faults (unless --no-faults): every `--fault-every` seconds one of the server's compile
workers is killed (SIGKILL); the server must replace it and no request may fail for it.

The report: requests answered (2xx), refused (4xx), failed (5xx), hung (no answer within
`--hang-s`, none allowed), cancelled on purpose; p50 / p99 latency of the plain requests; the
server's resident memory after warm-up and at the end; after `/flush_cache` the pool's used
tokens (must be 0) and the engine's integrity check of the pool and radix tree. The exit status
is 1 when a hang, an unexpected 5xx, a wrong answer, a leak or a failed check was seen.

This module also starts servers for the other server benchmarks here (`start_server`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
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

from benchmarks.server import rss_mb, wait_idle

REPO = Path(__file__).resolve().parents[1]
SMALL_ENGINE = ["--mem-budget-gb", "0.5", "--num-threads", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class Server:
    proc: subprocess.Popen
    url: str
    log: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, n: int = 4000) -> str:
        return Path(self.log).read_text(errors="replace")[-n:]


def start_server(
    model: str | None, extra: list[str] | None = None, module: str = "runtime.server"
) -> Server:
    """`python -m runtime.server` on a free port (the default model unless `model`), once
    `/health` answers."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="sgl-soak-", suffix=".log", delete=False).name
    cmd = [sys.executable, "-m", module, "--port", str(port), *SMALL_ENGINE, *(extra or [])]
    if model:
        cmd += ["--model", model]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.tail()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"server did not start:\n{server.tail()}")


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
    killed_workers: int = 0


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
        from benchmarks.isolation import pathological_cases

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
    except (TimeoutError, httpx.TimeoutException):
        t.hung += 1
        t.failures.append(f"{kind}: no answer within {hang_s} s")
        return
    except httpx.HTTPError as e:
        t.failed += 1
        t.failures.append(f"{kind}: {type(e).__name__}: {e}")
        return
    if status >= 500:
        t.failed += 1
        t.failures.append(problem or f"{kind}: {status}")
    elif status >= 400:
        t.refused += 1
        if kind not in ("malformed", "pathological"):
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
def compile_worker_pids(server_pid: int) -> list[int]:
    """The server's compile workers: its children running compile_worker.py."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == server_pid and b"compile_worker.py" in cmd:
            out.append(int(entry.name))
    return out


async def inject_faults(server: Server, every_s: float, until: float, t: Tally) -> None:
    rng = random.Random(0)
    while time.monotonic() + every_s < until:
        await asyncio.sleep(every_s)
        pids = compile_worker_pids(server.proc.pid)
        if pids:
            os.kill(rng.choice(pids), signal.SIGKILL)
            t.killed_workers += 1


def soak(url: str, server: Server | None, args: argparse.Namespace) -> dict:
    warm = Tally()
    asyncio.run(run_load(url, 0.25, min(args.clients, 4), args.hang_s, warm))  # warm-up
    wait_idle(url)
    pid = server.proc.pid if server is not None else None
    rss_start = rss_mb(pid)
    t = Tally()

    async def load_and_faults() -> None:
        until = time.monotonic() + args.minutes * 60
        jobs = [run_load(url, args.minutes, args.clients, args.hang_s, t)]
        if server is not None and args.fault_every > 0:
            jobs.append(inject_faults(server, args.fault_every, until, t))
        await asyncio.gather(*jobs)

    started = time.monotonic()
    asyncio.run(load_and_faults())
    took = time.monotonic() - started
    wait_idle(url)
    rss_end = rss_mb(pid)
    flush = httpx.post(f"{url}/flush_cache", timeout=60).json()
    stats = httpx.get(f"{url}/stats", timeout=30).json()
    q = sorted(t.plain_s)
    report = {
        "minutes": round(took / 60, 2),
        "clients": args.clients,
        "requests": t.answered + t.refused + t.failed + t.hung + t.cancelled,
        "answered_2xx": t.answered,
        "refused_4xx": t.refused,
        "failed_5xx": t.failed,
        "hung": t.hung,
        "cancelled_on_purpose": t.cancelled,
        "wrong": t.wrong[:10],
        "n_wrong": len(t.wrong),
        "failures": t.failures[:10],
        "plain_p50_s": round(statistics.median(q), 3) if q else None,
        "plain_p99_s": round(q[min(len(q) - 1, int(len(q) * 0.99))], 3) if q else None,
        "rss_start_mb": round(rss_start, 1),
        "rss_end_mb": round(rss_end, 1),
        "flushed": flush.get("flushed"),
        "pool_used_tokens_after_flush": stats.get("pool_used_tokens"),
        "integrity": flush.get("integrity", "not reported"),
        "compile_workers_killed": t.killed_workers,
        "by_kind": t.by_kind,
    }
    report["ok"] = (
        t.hung == 0
        and t.failed == 0
        and not t.wrong
        and report["pool_used_tokens_after_flush"] == 0
        and report["integrity"] in ("ok", "not reported")
        and not (rss_end > rss_start * 1.10)
    )
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--model", default=None)
    p.add_argument("--url", default=None, help="a running server (no faults then)")
    p.add_argument("--fault-every", type=float, default=30.0, help="seconds between faults")
    p.add_argument("--no-faults", dest="fault_every", action="store_const", const=0.0)
    p.add_argument("--hang-s", type=float, default=120.0, help="no answer within: hung")
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag")
    p.add_argument("--json", default=None, help="write the report here too")
    args = p.parse_args(argv)
    server = None if args.url else start_server(args.model, args.server_arg)
    url = args.url or server.url
    try:
        report = soak(url, server, args)
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
