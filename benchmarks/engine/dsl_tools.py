"""Tools inside programs: a batch of tool-using agent programs (`sgl.tool_loop`), greedy.

Run: .venv/bin/python -m benchmarks.engine.dsl_tools [--programs 32]

Each program asks one question that one of two tools answers (`multiply(a, b)` or
`get_temperature(city)`), then runs `tool_loop(max_turns=2, tool_choice="required",
on_max_turns="answer")`: the first turn must call a tool, the functions run with the validated
arguments, the second turn answers in text. The batch runs through `run_batch_async` on the
in-process engine and on a `python -m runtime.server` (`sgl.RuntimeEndpoint`: the server's
`/v1/chat/completions` with `tools`). Rows: programs per second; programs that finished;
calls made and calls valid (the call names a declared tool and its arguments validate against
the function's signature: what the strict constraint guarantees); calls that picked the tool
the question needs, and those with exactly the question's arguments (what the model decides:
the 135M default model's quality, not the constraint's); text answers.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from typing import Annotated, Any, Literal

from pydantic import Field

import sgl_dsl as sgl

CITIES = {"Paris": 18, "Oslo": 4, "Cairo": 31, "Lima": 22, "Tokyo": 16, "Rome": 24}


def multiply(
    a: Annotated[int, Field(ge=-10_000, le=10_000)], b: Annotated[int, Field(ge=-10_000, le=10_000)]
) -> int:
    """Multiply two integers."""
    return a * b


def get_temperature(
    city: Annotated[str, Field(max_length=20)],
    unit: Literal["celsius", "fahrenheit"] = "celsius",
) -> dict:
    """Today's temperature in a city."""
    return {"city": city, "temperature": CITIES.get(city.strip().title(), 15), "unit": unit}


TOOLS = [multiply, get_temperature]


@sgl.function
def agent(s, question):
    s += sgl.system("You are a helpful assistant. Use a tool, then answer in one sentence.")
    s += sgl.user(question)
    s += sgl.tool_loop(
        TOOLS, max_turns=2, tool_choice="required", on_max_turns="answer", max_tokens=64
    )


def questions(n: int, seed: int = 0) -> list[tuple[str, str, dict[str, Any]]]:
    """(question, the tool it needs, that tool's arguments)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2 == 0:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            out.append((f"What is {a} times {b}?", "multiply", {"a": a, "b": b}))
        else:
            city = rng.choice(sorted(CITIES))
            out.append((f"What is the temperature in {city} today?", "get_temperature",
                        {"city": city}))  # fmt: skip
    return out


def run_tools(backend: Any, cases: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    batch = [{"question": q} for q, _, _ in cases]
    backend.flush_cache()
    start = time.perf_counter()
    states = asyncio.run(agent.run_batch_async(batch, backend=backend, temperature=0))
    wall = time.perf_counter() - start
    row = {"wall": wall, "done": 0, "calls": 0, "valid": 0, "tool": 0, "args": 0, "answers": 0}
    for state, (_, tool, args) in zip(states, cases, strict=True):
        if state.error is not None:
            continue
        row["done"] += 1
        calls = state["tool_calls"]
        row["calls"] += len(calls)
        # a ToolCall exists only when its name is declared and its arguments validated
        row["valid"] += sum(c.ran and c.name in ("multiply", "get_temperature") for c in calls)
        first = calls[0] if calls else None
        if first is not None and first.name == tool:
            row["tool"] += 1
            given = {k: first.arguments[k] for k in args}
            row["args"] += given == args
        row["answers"] += isinstance(state["answer"], str) and bool(state["answer"].strip())
    return row


def tools_suite(programs: int, num_threads: int | None = None) -> None:
    from benchmarks.engine.dsl import start_server

    cases = questions(programs)
    print(f"\ntool-using agents (tool_loop, 2 turns, first call required), {programs} programs")
    print("| backend | programs/s | finished | calls valid | right tool | right args | answers |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    engine_kwargs = {"num_threads": num_threads} if num_threads else {}
    runtime = sgl.Runtime(**engine_kwargs)
    server, url = start_server(num_threads)
    try:
        for label, backend in (("in-process", runtime), ("server", sgl.RuntimeEndpoint(url))):
            run_tools(backend, cases[:2])  # warm: code paths and the call schema's compile
            row = run_tools(backend, cases)
            n = programs
            print(
                f"| {label} | {n / row['wall']:.2f} | {row['done']}/{n} | "
                f"{row['valid']}/{row['calls']} | {row['tool']}/{n} | {row['args']}/{n} | "
                f"{row['answers']}/{n} |",
                flush=True,
            )
    finally:
        runtime.shutdown()
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=32)
    parser.add_argument("--num-threads", type=int, default=None, help="engine threads")
    args = parser.parse_args()
    tools_suite(args.programs, args.num_threads)


if __name__ == "__main__":
    main()
