"""Tool calls through the OpenAI API on the default model: strict generation vs exact JSON Schema.

Run: .venv/bin/python -m benchmarks.tools [--model PATH] [--url URL (a running server)]
     [--concurrency 8] [--max-tokens 128]

32 chat requests (8 questions for each of 4 tools whose parameter schemas are written as
LangChain writes them: properties, descriptions, required, no additionalProperties), each sent
with tool_choice "required" (forced) and "auto", under `json_schema_mode` "strict" (the
server's default: objects emit only their declared properties) and "exact" (the schema's own
language, where any extra key is allowed). Per configuration: the share of responses with a
valid call (a known tool, arguments that validate against its schema), the share of calls
carrying undeclared arguments, mean completion tokens, and the wall time of the 32 requests.
Greedy decoding with `--repetition-penalty` (1.05 by default, every row alike): a 135M model at
temperature 0 can repeat a phrase inside a string argument until max_tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from types import SimpleNamespace

import httpx
import jsonschema

from benchmarks.server import start_server


def _tool(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def _s(desc: str, **kw) -> dict:
    return {"type": "string", "description": desc, **kw}


TOOLS = [
    _tool(
        "get_weather",
        "Get the current weather in a city.",
        {"city": _s("The city name"), "unit": _s("Temperature unit", enum=["c", "f"])},
        ["city"],
    ),
    _tool(
        "search_flights",
        "Search flights between two cities on a date.",
        {
            "origin": _s("Departure city"),
            "destination": _s("Arrival city"),
            "date": _s("Date as YYYY-MM-DD"),
            "passengers": {"type": "integer", "description": "Number of passengers"},
        },
        ["origin", "destination", "date"],
    ),
    _tool(
        "convert_currency",
        "Convert an amount of money from one currency to another.",
        {
            "amount": {"type": "number", "description": "The amount to convert"},
            "from_currency": _s("ISO code of the source currency"),
            "to_currency": _s("ISO code of the target currency"),
        },
        ["amount", "from_currency", "to_currency"],
    ),
    _tool(
        "create_reminder",
        "Create a reminder that fires after some minutes.",
        {
            "text": _s("What to remind about"),
            "minutes": {"type": "integer", "description": "Minutes from now"},
            "priority": _s("Priority", enum=["low", "normal", "high"]),
        },
        ["text", "minutes"],
    ),
]
QUESTIONS = [
    *[f"What is the weather like in {c}?" for c in ("Paris", "Tokyo", "Oslo", "Lima")],
    *[f"Is it raining in {c} right now?" for c in ("Rome", "Cairo", "Seoul", "Quito")],
    *[f"Find me a flight from {a} to {b} on 2025-0{i + 1}-12." for i, (a, b) in
      enumerate([("Berlin", "Madrid"), ("Boston", "Denver"), ("Delhi", "Dubai"),
                 ("Sydney", "Perth")])],  # fmt: skip
    *[f"Book {n} seats from London to Nice on 2025-07-0{n}." for n in (1, 2, 3, 4)],
    *[f"Convert {a} {x} to {y}." for a, x, y in
      [(100, "USD", "EUR"), (25, "GBP", "JPY"), (9.5, "CHF", "SEK"), (1200, "INR", "USD")]],
    *[f"How many {y} is {a} {x}?" for a, x, y in
      [(50, "EUR", "USD"), (7, "CAD", "AUD"), (300, "NOK", "DKK"), (42, "BRL", "MXN")]],
    *[f"Remind me to {t} in {m} minutes." for t, m in
      [("call mom", 10), ("stretch", 30), ("check the oven", 5), ("send the report", 45)]],
    *[f"Set a high priority reminder to {t} in {m} minutes." for t, m in
      [("pay rent", 60), ("take pills", 15), ("water plants", 90), ("leave", 20)]],
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def judge(message: dict) -> tuple[bool, bool]:
    """(a valid call, a call with undeclared arguments) for one response message."""
    calls = message.get("tool_calls") or []
    if not calls:
        return False, False
    valid, extra = True, False
    for c in calls:
        schema = SCHEMAS.get(c["function"]["name"])
        try:
            args = json.loads(c["function"]["arguments"])
            jsonschema.validate(args, schema)
        except (TypeError, ValueError, jsonschema.ValidationError):
            valid = False
            continue
        extra = extra or bool(set(args) - set(schema["properties"]))
    return valid, extra


async def run_config(url: str, model: str, mode: str, choice: str, args) -> dict:
    sem = asyncio.Semaphore(args.concurrency)
    rows: list[tuple[bool, bool, int]] = []

    async def one(http: httpx.AsyncClient, question: str) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": question}],
            "tools": TOOLS,
            "tool_choice": choice,
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "repetition_penalty": args.repetition_penalty,
            "json_schema_mode": mode,
        }
        async with sem:
            r = await http.post(f"{url}/v1/chat/completions", json=body)
        r.raise_for_status()
        out = r.json()
        valid, extra = judge(out["choices"][0]["message"])
        rows.append((valid, extra, out["usage"]["completion_tokens"]))

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(one(http, q) for q in QUESTIONS))
    wall = time.perf_counter() - started
    n = len(rows)
    return {
        "mode": mode,
        "tool_choice": choice,
        "valid": sum(r[0] for r in rows) / n,
        "extra": sum(r[1] for r in rows) / n,
        "tokens": sum(r[2] for r in rows) / n,
        "wall": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--url", default=None, help="a running server (else one is started)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.05)
    args = p.parse_args()
    proc = None
    if args.url is None:
        ns = SimpleNamespace(model=args.model, num_threads=args.num_threads, max_queue=256,
                             max_running=64, url=None)  # fmt: skip
        proc = start_server(ns)
        args.url = ns.url
    try:
        model = httpx.get(f"{args.url}/v1/models", timeout=30).json()["data"][0]["id"]
        # warm-up: compile each configuration's constraint once, outside the timings
        asyncio.run(_warm(args.url, model))
        results = [
            asyncio.run(run_config(args.url, model, mode, choice, args))
            for choice in ("required", "auto")
            for mode in ("strict", "exact")
        ]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    print(
        f"\n{len(QUESTIONS)} requests per row, {len(TOOLS)} tools, model {model}, greedy, "
        f"repetition_penalty {args.repetition_penalty}, max_tokens {args.max_tokens}\n"
    )
    print("| tool_choice | json_schema_mode | valid calls | calls with undeclared args "
          "| mean completion tokens | wall s |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['tool_choice']} | {r['mode']} | {r['valid']:.0%} | {r['extra']:.0%} "
            f"| {r['tokens']:.1f} | {r['wall']:.1f} |"
        )


async def _warm(url: str, model: str) -> None:
    async with httpx.AsyncClient(timeout=600) as http:
        for mode in ("strict", "exact"):
            for choice in ("required", "auto"):
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": TOOLS,
                    "tool_choice": choice,
                    "max_tokens": 4,
                    "json_schema_mode": mode,
                }
                (await http.post(f"{url}/v1/chat/completions", json=body)).raise_for_status()


if __name__ == "__main__":
    main()
