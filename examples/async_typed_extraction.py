"""An async batch of typed extractions: every document becomes a `Person` instance.

Run: .venv/bin/python -m examples.async_typed_extraction [--n 24]

One event loop drives the whole batch (`run_batch_async`), no thread per program; `gen(type=...)`
constrains each answer to the type's JSON form and `state[name]` is the parsed value: a pydantic
model instance, an Enum member, an int.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import threading
import time
from typing import Annotated

from pydantic import BaseModel, Field

import sgl_dsl as sgl


class Job(enum.Enum):
    BAKER = "baker"
    PILOT = "pilot"
    TEACHER = "teacher"
    NURSE = "nurse"
    OTHER = "other"


class Person(BaseModel):
    name: str
    age: Annotated[int, Field(ge=0, le=120)]
    city: str
    job: Job


PEOPLE = [
    ("Maria Lopez", 34, "Valencia", "opened a bakery"),
    ("John Carter", 71, "Denver", "still flies planes as a pilot"),
    ("Aiko Tanaka", 29, "Osaka", "teaches maths at a high school"),
    ("Samuel Okoye", 45, "Lagos", "works night shifts as a nurse"),
    ("Lena Berg", 52, "Oslo", "repairs old clocks"),
    ("Pedro Alves", 38, "Porto", "bakes bread every morning"),
]


def documents(n: int) -> list[str]:
    out = []
    for i in range(n):
        name, age, city, what = PEOPLE[i % len(PEOPLE)]
        out.append(f"{name}, aged {age + i // len(PEOPLE)}, lives in {city} and {what}.")
    return out


@sgl.function
def extract(s, document):
    s += sgl.system("Extract the person described in the text as JSON.")
    s += sgl.user(document)
    s += sgl.assistant(sgl.gen("person", type=Person, max_tokens=80))


async def run(docs: list[str]) -> list[sgl.ProgramState]:
    return await extract.run_batch_async([{"document": d} for d in docs], temperature=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=12)
    args = parser.parse_args()
    sgl.set_default_backend(sgl.Runtime())
    docs = documents(args.n)
    start = time.perf_counter()
    states = asyncio.run(run(docs))
    wall = time.perf_counter() - start
    for doc, state in zip(docs, states, strict=True):
        if state.error is not None:
            print(f"{doc}\n  -> error: {state.error}")
            continue
        person: Person = state["person"]  # already a Person: parsed and validated
        print(f"{doc}\n  -> {person.name!r}, {person.age}, {person.city!r}, {person.job.name}")
    valid = sum(s.error is None and isinstance(s["person"], Person) for s in states)
    threads = threading.active_count()
    print(f"{valid}/{len(states)} typed values in {wall:.1f} s; threads in this process: {threads}")


if __name__ == "__main__":
    main()
