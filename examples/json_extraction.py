"""Extract a record from text as JSON that validates against a pydantic model.

Run: .venv/bin/python -m examples.json_extraction
"""

from __future__ import annotations

from pydantic import BaseModel

import sgl_dsl as sgl


class Person(BaseModel):
    name: str
    age: int
    city: str


DOCUMENTS = [
    "Maria Lopez, 34, moved to Valencia last spring to open a bakery.",
    "At 71, retired pilot John Carter still flies gliders near his home in Denver.",
]


@sgl.function
def extract_person(s, document):
    s += sgl.system("Extract the person described in the text as JSON.")
    s += sgl.user(document)
    s += sgl.assistant(sgl.gen("person", json_schema=Person, max_tokens=64))


def main() -> None:
    sgl.set_default_backend(sgl.Runtime())
    states = extract_person.run_batch([{"document": d} for d in DOCUMENTS], temperature=0)
    for state in states:
        person = Person.model_validate_json(state["person"])  # always valid: constrained decoding
        print(person)


if __name__ == "__main__":
    main()
