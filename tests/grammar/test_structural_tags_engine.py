"""Structural tags and GBNF grammars through the engine (tiny random model, SmolLM2's
tokenizer): outputs obey the constraint, and forced text (a tag's begin after its trigger, the
end string, a grammar's fixed words) is jumped over with the tokenizer's own ids."""

from __future__ import annotations

import json
import re

import pytest

from runtime import Engine
from tests.support.tiny_models import make_tiny_model

SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"enum": [1, 2]}},
    "required": ["city", "days"],
}
# the only tag, opened at once: everything but the enum choices is forced
TAG = {
    "type": "structural_tag",
    "format": {
        "type": "triggered_tags",
        "triggers": ["<call="],
        "tags": [{"type": "tag", "begin": "<call=weather>",
                  "content": {"type": "json_schema", "json_schema": SCHEMA}, "end": "</call>"}],
        "at_least_one": True,
        "stop_after_first": True,
    },
}  # fmt: skip
GBNF = """
root   ::= "answer: " ("yes" | "no") " because " reason "."
reason ::= [a-z]+ | "(" reason ")"
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-structural"), seed=5)
    with Engine(folder, page_size=4, max_total_tokens=4096) as e:
        yield e


def test_structural_tag_call_is_valid_and_forced_text_is_jumped(engine) -> None:
    r = engine.generate("Call:", structural_tag=TAG, max_new_tokens=60, temperature=1.0, seed=3)
    assert r.finish_reason == "stop", (r.text, r.error)
    m = re.fullmatch(r"<call=weather>(.*)</call>", r.text)
    assert m is not None, r.text
    args = json.loads(m.group(1))
    assert args["city"] in ("Paris", "Rome") and args["days"] in (1, 2)
    assert r.usage.decode_steps < r.usage.completion_tokens  # forced text took no decode step
    assert r.token_ids == engine.tokenizer.encode(r.text, add_special_tokens=False)


def test_gbnf_grammar_output_parses_and_fixed_words_are_jumped(engine) -> None:
    results = engine.generate(
        ["Q1:", "Q2:", "Q3:"], ebnf=GBNF, max_new_tokens=40, temperature=1.0, seed=9
    )
    for r in results:
        if r.finish_reason == "stop":
            assert re.fullmatch(r"answer: (yes|no) because \(*[a-z]+\)*\.", r.text), r.text
            opened, closed = r.text.count("("), r.text.count(")")
            assert opened == closed, r.text
        else:
            assert r.finish_reason == "length" and r.text.startswith("answer: "), r.text
    assert any(r.usage.decode_steps < r.usage.completion_tokens for r in results)
    engine.check_integrity()
