"""The nested records the agent-library tests extract (tests/server/clients/), as pydantic writes
them: a model that holds another model (`$defs` / `$ref` in its JSON Schema) and a list of those.
The default model is tiny, so the tests check the protocol (what comes back validates against
these), never whether the values are true."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from pydantic import BaseModel, Field

PROMPT = "Alice, 34, lives in Paris, France. Bob, 40, lives in Rome, Italy. Extract."


class Address(BaseModel):
    city: str = Field(max_length=20)
    country: str = Field(max_length=20)


class Person(BaseModel):
    """A person and where they live."""

    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=120)
    address: Address


class Team(BaseModel):
    """People named in a text."""

    members: list[Person] = Field(min_length=1, max_length=2)


def age_of(name: str) -> int:
    """The age of a person, by name (the tool the agents call)."""
    return 34


AGE_TOOL_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
}


def check_arguments(arguments: str | dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments (JSON text or already parsed) validated against its tool's schema."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, schema)
    return args
