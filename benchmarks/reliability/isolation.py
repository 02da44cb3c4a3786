"""Pathological constraints beside a plain request: does one user's compile stall the others?

Run: .venv/bin/python -m benchmarks.reliability.isolation [--model PATH]
     [--url URL (a running server)] [--only NAME ...] [--server-arg=--grammar-compile-timeout=5 ...]

For each pathological request of the table below, the pathological request is sent, and a
moment later (its compile under way) a plain chat completion (16 tokens) beside it. Printed per
row: the pathological request's status, its time and the first words of its answer, and the
plain request's time (alone: measured first, median of 3), and a control row: the plain
request beside a process that only keeps a core busy (what any compile, wherever it runs,
costs on a machine with few cores). The server is started here (the
default model, a small KV budget) unless `--url` names one. Numbers move with the machine's
other load: say what ran beside.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

PLAIN = {
    "messages": [{"role": "user", "content": "Name one museum in Paris."}],
    "max_tokens": 16,
    "temperature": 0,
}


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


def _schema(schema: dict) -> dict:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    }


def pathological_cases() -> dict[str, dict[str, Any]]:
    """Name -> the extra body fields of a chat request that carries the constraint."""
    return {
        "regex a{1000000}": {"regex": "a{1000000}"},
        "enum of 100,000 strings": _schema({"enum": [f"value-{i}" for i in range(100_000)]}),
        "string minLength 1,000,000": _schema({"type": "string", "minLength": 1_000_000}),
        "array minItems 100,000": _schema(
            {"type": "array", "items": {"type": "integer"}, "minItems": 100_000}
        ),
        "pattern with maxLength 100,000": _schema(
            {"type": "string", "pattern": "^[a-z]+( [a-z]+)*$", "maxLength": 100_000}
        ),
        "exponential DFA (a|b)*a(a|b){22}": {"regex": "(a|b)*a(a|b){22}"},
        "nested counters ((a{0,40}b){0,40}c){0,40}": {"regex": "((a{0,40}b){0,40}c){0,40}"},
        "300-deep objects": _schema(_nested(300)),
        "(ab|cd){20000}": {"regex": "(ab|cd){20000}"},
    }


@dataclass(slots=True)
class Row:
    name: str
    status: int | str
    seconds: float
    detail: str
    plain_s: float


def _post(url: str, body: dict, timeout: float) -> tuple[int | str, float, str]:
    start = time.perf_counter()
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}", time.perf_counter() - start, ""
    took = time.perf_counter() - start
    try:
        data = r.json()
    except ValueError:
        return r.status_code, took, r.text[:80]
    if r.status_code == 200:
        text = data["choices"][0]["message"].get("content") or ""
        return r.status_code, took, f"{data['choices'][0]['finish_reason']}: {text[:40]!r}"
    return r.status_code, took, str(data.get("error", {}).get("message", ""))[:110]


def plain_alone(url: str, n: int = 3) -> float:
    return statistics.median(_post(url, PLAIN, 60)[1] for _ in range(n))


def beside(url: str, name: str, extra: dict, delay_s: float, timeout: float) -> Row:
    """The pathological request, and `delay_s` later the plain one beside it."""
    out: dict[str, Any] = {}
    body = {**PLAIN, "max_tokens": 8, **extra}

    def send() -> None:
        out["bad"] = _post(url, body, timeout)

    t = threading.Thread(target=send)
    t.start()
    time.sleep(delay_s)
    _, plain_s, _ = _post(url, PLAIN, timeout)
    t.join()
    status, seconds, detail = out["bad"]
    return Row(name, status, seconds, detail, plain_s)


def beside_a_busy_core(url: str, seconds: float = 10.0) -> Row:
    """The control row: the plain request beside a process that only burns a core at the
    compile workers' priority (nice 5), as a compile would: what a busy core costs here."""
    import subprocess

    burner = subprocess.Popen(
        [sys.executable, "-c", f"import os, time; os.nice(5); end = time.time() + {seconds}\n"
         "while time.time() < end: pass"]
    )  # fmt: skip
    time.sleep(0.3)
    _, plain_s, _ = _post(url, PLAIN, 60)
    burner.kill()
    burner.wait()
    return Row("(control) a core busy at nice 5, no request", "-", 0.0, "", plain_s)


def run(url: str, only: list[str], delay_s: float, timeout: float) -> list[Row]:
    _post(url, PLAIN, 120)  # warm-up
    alone = plain_alone(url)
    print(f"plain request alone: {alone:.2f} s (median of 3)")
    rows = [beside_a_busy_core(url)]
    print(f"| {rows[0].name} | - | {rows[0].plain_s:.2f} s |", flush=True)
    for name, extra in pathological_cases().items():
        if only and not any(o in name for o in only):
            continue
        row = beside(url, name, extra, delay_s, timeout)
        rows.append(row)
        print(
            f"| {row.name} | {row.status} after {row.seconds:.1f} s ({row.detail}) "
            f"| {row.plain_s:.2f} s |",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reliability.isolation")
    p.add_argument("--model", default=None)
    p.add_argument("--url", default=None, help="a running server (else one is started)")
    p.add_argument("--only", nargs="*", default=[], help="rows whose name contains any of these")
    p.add_argument("--delay", type=float, default=0.3, help="seconds before the plain request")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag")
    p.add_argument("--json", default=None, help="write the rows here as JSON")
    args = p.parse_args(argv)
    server = None
    url = args.url
    if url is None:
        from benchmarks.reliability.topologies import start_server

        server = start_server(args.model, args.server_arg)
        url = server.url
    try:
        rows = run(url, args.only, args.delay, args.timeout)
    finally:
        if server is not None:
            server.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump([_row(r) for r in rows], f)
    return 0


def _row(r: Row) -> dict:
    return {k: getattr(r, k) for k in Row.__slots__}


if __name__ == "__main__":
    sys.exit(main())
