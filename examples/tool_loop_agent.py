"""A tool-using agent program: the model calls Python functions until it can answer.

Run: .venv/bin/python -m examples.tool_loop_agent [--url http://127.0.0.1:30000]

`sgl.tool_loop(tools, max_turns=...)` generates with the tools (the calls written in the
model's own tool-call format, strictly: each call names a declared tool and its arguments match
the function's signature), calls the functions with the validated arguments, feeds each result
back as a `tool` message through the chat template, and stops when the model answers in text.
The calls (with their results) and the answer are in the state. Without `--url` the program
runs on the in-process engine (the default model); with it, through a `runtime.server`.
"""

from __future__ import annotations

import argparse
from typing import Annotated, Literal

from pydantic import Field

import sgl_dsl as sgl

TEMPERATURES = {"paris": 18, "oslo": 4, "cairo": 31, "lima": 22}


def get_temperature(
    city: Annotated[str, Field(max_length=20, description="a city name")],
    unit: Literal["celsius", "fahrenheit"] = "celsius",
) -> dict:
    """Today's temperature in a city."""
    celsius = TEMPERATURES.get(city.strip().lower(), 15)
    value = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32)
    return {"city": city, "temperature": value, "unit": unit}


def multiply(
    a: Annotated[int, Field(ge=-10_000, le=10_000)], b: Annotated[int, Field(ge=-10_000, le=10_000)]
) -> int:
    """Multiply two integers."""
    return a * b


TOOLS = [get_temperature, multiply]


@sgl.function
def agent(s, question):
    s += sgl.system(
        "You are a helpful assistant. When you see a tool result, tell the user in one sentence."
    )
    s += sgl.user(question)
    # the first turn must call a tool; the second (the last) answers in text
    s += sgl.tool_loop(
        TOOLS, max_turns=2, tool_choice="required", on_max_turns="answer", max_tokens=96
    )


QUESTIONS = ["What is the temperature in Oslo today?", "What is 17 times 23?"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a runtime.server to run on (default: in-process engine)")
    args = parser.parse_args()
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    try:
        for question in QUESTIONS:
            state = agent.run(question=question, backend=backend, temperature=0)
            print(f"Q: {question}")
            for call in state["tool_calls"]:
                print(f"  call {call.name}({call.arguments}) -> {call.result!r}")
            print(f"  answer: {state['answer']!r}")
    finally:
        backend.shutdown()


if __name__ == "__main__":
    main()
