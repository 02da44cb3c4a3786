"""Behaviour of DSL programs on the real default model (SmolLM2-135M-Instruct).

One engine for the module. Assertions are about what a 135M model reliably shows: few-shot
answers to easy questions, constrained output that parses and validates, fork bookkeeping,
caching, streaming. Greedy everywhere.
"""

from __future__ import annotations

import ast
import json
import operator

import jsonschema
import pytest

import sgl_dsl as sgl
from tests.support.dsl_backends import ENGINE_KWARGS

pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def runtime():
    backend = sgl.Runtime(**ENGINE_KWARGS)
    yield backend
    backend.shutdown()


@sgl.function
def few_shot_qa(s, question):
    s += "Answer with the name of a city.\n\n"
    s += "Q: What is the capital of France?\nA: Paris\n\n"
    s += "Q: What is the capital of Italy?\nA: Rome\n\n"
    s += "Q: What is the capital of Spain?\nA: Madrid\n\n"
    s += "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=8, stop="\n")


def test_few_shot_qa_run(runtime):
    state = few_shot_qa.run(
        question="What is the capital of Japan?", backend=runtime, temperature=0
    )
    assert state["answer"].strip() == "Tokyo"


def test_few_shot_qa_run_batch(runtime):
    questions = {"Germany": "Berlin", "Japan": "Tokyo", "England": "London", "Russia": "Moscow"}
    states = few_shot_qa.run_batch(
        [{"question": f"What is the capital of {c}?"} for c in questions],
        backend=runtime,
        temperature=0,
        progress_bar=True,
    )
    answers = [s["answer"].strip() for s in states]
    assert sum(a == b for a, b in zip(answers, questions.values(), strict=True)) >= 3, answers
    # the few-shot header was prefilled once and found by every program
    assert all(s.get_meta_info("answer")["cached_tokens"] >= 48 for s in states)


@sgl.function
def judge(s, statement):
    s += "Label each statement True, False or Unknown.\n\n"
    s += "Statement: Fire is cold.\nLabel: False\n\n"
    s += "Statement: Birds have feathers.\nLabel: True\n\n"
    s += "Statement: It will rain in Oslo on 3 May 2091.\nLabel: Unknown\n\n"
    s += "Statement: " + statement + "\nLabel: "
    s += sgl.select("verdict", ["True", "False", "Unknown"])


def test_select_true_false_unknown(runtime):
    state = judge.run(statement="The sun rises in the east.", backend=runtime)
    assert state["verdict"] == "True"
    assert state.text().endswith("Label: True")
    scores = state.get_meta_info("verdict")["token_logprobs"]
    assert len(scores) == 3 and all(lp and max(lp) <= 0 for lp in scores)


def test_integer_and_regex_decoding(runtime):
    @sgl.function
    def facts(s):
        s += sgl.user("How many legs does a spider have?")
        s += sgl.assistant(sgl.gen("legs", dtype=int, max_tokens=8))
        s += sgl.user("Give an IPv4 address for a home router.")
        s += sgl.assistant(
            sgl.gen("ip", regex=r"(25[0-5]|2[0-4]\d|1?\d?\d)(\.(25[0-5]|2[0-4]\d|1?\d?\d)){3}")
        )

    state = facts.run(backend=runtime, temperature=0, max_new_tokens=24)
    assert isinstance(state["legs"], str)
    int(state["legs"])
    parts = state["ip"].split(".")
    assert len(parts) == 4 and all(0 <= int(p) <= 255 for p in parts)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 40},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def test_json_decoding_parses_and_validates(runtime):
    @sgl.function
    def extract(s, document):
        s += sgl.system("Extract the person as JSON.")
        s += sgl.user(document)
        s += sgl.assistant(sgl.gen("person", json_schema=PERSON, max_tokens=64))

    docs = [
        "Maria Lopez, 34, lives in Valencia.",
        "John Carter is 71 years old and lives in Denver.",
    ]
    states = extract.run_batch([{"document": d} for d in docs], backend=runtime, temperature=0)
    for state in states:
        assert state.error is None, state.error
        jsonschema.validate(json.loads(state["person"]), PERSON)


def test_parallel_decoding_fork_join(runtime):
    @sgl.function
    def tips(s, topic):
        s += sgl.system("You give short tips.")
        s += sgl.user("Give one tip about " + topic + ".")
        forks = s.fork(3)
        for i, f in enumerate(forks):
            f += sgl.assistant(sgl.gen("tip", max_tokens=24, stop="\n", temperature=0.7, seed=i))
        forks.join()
        s += sgl.user("Summarise the tips in one sentence.")
        s += sgl.assistant(sgl.gen("summary", max_tokens=32, stop="\n"))

    state = tips.run(topic="sleep", backend=runtime, temperature=0)
    assert len(state["tip"]) == 3 and all(t.strip() for t in state["tip"])
    assert state["summary"].strip()
    # the parent's text has no fork text; each fork's gen found the shared prefix cached
    assert all(t not in state.text() for t in state["tip"])
    assert all(m["cached_tokens"] >= 16 for m in state.get_meta_info("tip"))


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expression: str) -> int:
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"not arithmetic: {expression!r}")

    return ev(ast.parse(expression.strip(), mode="eval").body)


@sgl.function
def calculator_step(s, question, regex=None):
    s += "Write the arithmetic expression for the question.\n"
    s += "Question: Tom has 3 apples and buys 4 more.\nExpression: 3 + 4\n"
    s += "Question: A pack has 12 pens. How many pens are in 3 packs?\nExpression: 12 * 3\n"
    s += "Question: " + question + "\nExpression:"
    s += sgl.gen("expr", max_tokens=12, stop="\n", regex=regex)
    # the tool call: Python evaluates what the model wrote, and the result goes back in
    s += "\nResult: " + str(evaluate(s["expr"]))


QUESTION = "A box holds 6 eggs. How many eggs are in 5 boxes?"


def test_tool_use_evaluates_a_generated_expression(runtime):
    state = calculator_step.run(question=QUESTION, backend=runtime, temperature=0)
    assert state.text().endswith(f"Result: {evaluate(state['expr'])}")
    assert sorted(int(n) for n in state["expr"].split()[::2]) == [5, 6]


def test_tool_use_with_a_regex_constrained_expression(runtime):
    state = calculator_step.run(
        question=QUESTION, regex=r" \d+ [-+*] \d+", backend=runtime, temperature=0
    )
    assert state.text().endswith(f"Result: {evaluate(state['expr'])}")
    assert sorted(int(n) for n in state["expr"].split()[::2]) == [5, 6]


def test_streaming_answer(runtime):
    @sgl.function
    def explain(s):
        s += sgl.user("Name three colours.")
        s += sgl.assistant(sgl.gen("answer", max_tokens=24))

    state = explain.run(backend=runtime, stream=True, temperature=0)
    pieces = list(state.text_iter("answer"))
    assert len(pieces) > 3
    assert "".join(pieces) == state["answer"]
    assert state.get_meta_info("answer")["completion_tokens"] <= 24
