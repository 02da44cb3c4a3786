"""Every example's program runs on the scripted fake backend (the real runs are by hand)."""

from __future__ import annotations

import asyncio

import pytest

from examples import (
    async_typed_extraction,
    few_shot_qa,
    json_extraction,
    quickstart,
    streaming,
    tool_agent,
    tree_of_thought,
)
from tests.support.dsl_backends import FakeBackend


@pytest.mark.parametrize(
    ("program", "kwargs", "variables"),
    [
        pytest.param(quickstart.city_facts, {"city": "Paris"}, ["fact", "capital", "record"],
                     id="quickstart"),
        pytest.param(few_shot_qa.few_shot_qa, {"question": "Q?"}, ["answer"], id="few_shot_qa"),
        pytest.param(json_extraction.extract_person, {"document": "Ann, 3, Oslo"}, ["person"],
                     id="json_extraction"),
        pytest.param(tree_of_thought.tree_of_thought, {"question": "Why?"}, ["idea", "best"],
                     id="tree_of_thought"),
        pytest.param(streaming.explain, {"topic": "rain"}, ["answer"], id="streaming"),
    ],
)  # fmt: skip
def test_example_programs_run(program, kwargs, variables):
    state = program.run(backend=FakeBackend(), **kwargs)
    for name in variables:
        assert name in state


def test_tool_agent_calls_the_chosen_tool():
    backend = FakeBackend({"Input: ": "17 * 23"}, scores={"calculator": -0.1})
    state = tool_agent.agent_step.run(request="What is 17 times 23?", backend=backend)
    assert state["tool"] == "calculator"
    assert {"role": "user", "content": "Tool result: 391"} in state.messages()


def test_example_prefixes_are_hoistable():
    backend = FakeBackend()
    assert few_shot_qa.few_shot_qa.prefix(backend).endswith("A: Rome\n\nQ: ")
    assert "Extract the person" in json_extraction.extract_person.prefix(backend)


def test_async_typed_extraction_gives_person_instances():
    example = async_typed_extraction
    answer = '{"name":"Ann","age":3,"city":"Oslo","job":"nurse"}'
    backend = FakeBackend({"<|im_start|>assistant\n": answer})
    docs = example.documents(8)
    batch = [{"document": d} for d in docs]
    states = asyncio.run(example.extract.run_batch_async(batch, backend=backend))
    assert all(s["person"] == example.Person(name="Ann", age=3, city="Oslo", job="nurse")
               for s in states)  # fmt: skip
    assert len(set(docs)) == len(docs)
