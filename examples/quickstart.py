"""Quickstart: one program with a free-text gen, a select and a JSON gen.

Run: .venv/bin/python -m examples.quickstart   (the default model, SmolLM2-135M-Instruct)
"""

from __future__ import annotations

import json

from pydantic import BaseModel

import sgl_dsl as sgl


class City(BaseModel):
    name: str
    country: str


@sgl.function
def city_facts(s, city):
    s += sgl.system("You are a concise geography assistant.")
    s += sgl.user("Tell me one fact about " + city + ".")
    s += sgl.assistant(sgl.gen("fact", max_tokens=40, stop="\n"))
    s += sgl.user("Is " + city + " a capital city? Answer yes or no.")
    s += sgl.assistant(sgl.select("capital", ["yes", "no"]))
    s += sgl.user("Give " + city + " as a JSON record with its name and country.")
    s += sgl.assistant(sgl.gen("record", json_schema=City, max_tokens=48))


def main() -> None:
    sgl.set_default_backend(sgl.Runtime())
    state = city_facts.run(city="Paris", temperature=0)
    print("fact:    ", state["fact"])
    print("capital: ", state["capital"])
    print("record:  ", json.loads(state["record"]))
    print("cached prompt tokens of the JSON gen:", state.get_meta_info("record")["cached_tokens"])


if __name__ == "__main__":
    main()
