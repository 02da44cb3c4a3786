"""Lark grammars as constraints in the engine, the DSL and the server's /generate."""

from __future__ import annotations

import lark
import pytest

import sgl_dsl as sgl
from runtime import Engine
from tests.support.tiny_models import make_tiny_model

# a finite language: every sampled output ends within the token budget
SELECT_GRAMMAR = r"""
start: "SELECT " column ("," column)~0..2 " FROM " table
column: "id" | "name" | "price"
table: "users" | "orders"
"""
# recursive: nesting has no depth limit, so a random model may run out of tokens first
NESTED_GRAMMAR = r"""
start: list
list: "[" [item ("," item)*] "]"
item: list | DIGIT
DIGIT: /[0-9]/
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-grammar"), seed=11)
    with Engine(folder, page_size=4, max_total_tokens=4096) as e:
        yield e


@pytest.mark.parametrize(
    ("grammar_text", "must_stop"),
    [
        pytest.param(SELECT_GRAMMAR, True, id="finite-select"),
        pytest.param(NESTED_GRAMMAR, False, id="recursive-lists"),
    ],
)
@pytest.mark.parametrize("jump", [True, False], ids=["jump", "masks-only"])
def test_sampled_outputs_are_sentences_lark_parses(engine, grammar_text, must_stop, jump):
    parser = lark.Lark(grammar_text, parser="lalr")
    prompts = [f"Write one {i}:" for i in range(4)]
    results = engine.generate(prompts, grammar=grammar_text, max_new_tokens=40, temperature=1.0,
                              seed=7, jump_forward=jump)  # fmt: skip
    for r in results:
        if must_stop:
            assert r.finish_reason == "stop", (r.text, r.error)
        if r.finish_reason == "stop":
            parser.parse(r.text)  # raises if the engine let a non-sentence through
        else:
            assert r.finish_reason == "length" and r.text.startswith("[")
    engine.check_integrity()


def test_forced_keywords_are_jumped_and_ids_match_the_tokenizer(engine):
    r = engine.generate("Query:", grammar=SELECT_GRAMMAR, max_new_tokens=40, temperature=0.0)
    assert r.finish_reason == "stop"
    assert r.text.startswith("SELECT ")
    # "SELECT " and " FROM " are forced: fewer forward passes than output tokens
    assert r.usage.decode_steps < r.usage.completion_tokens
    assert r.token_ids == engine.tokenizer.encode(r.text, add_special_tokens=False)


def test_bad_grammar_raises_alone_and_fails_alone_in_a_batch(engine):
    from grammar import GrammarError

    with pytest.raises(GrammarError, match="undefined_rule"):
        engine.generate("x", grammar="start: undefined_rule", max_new_tokens=4)
    bad = engine.generate(["x", "y"], grammar="start: undefined_rule", max_new_tokens=4)
    assert all(r.finish_reason == "abort" and "undefined_rule" in r.error for r in bad)
    good = engine.generate("y", grammar=SELECT_GRAMMAR, max_new_tokens=40, temperature=0.0)
    assert good.finish_reason == "stop"  # the engine serves on


def test_dsl_gen_grammar(engine):
    @sgl.function
    def query(s):
        s += "Query: " + sgl.gen("sql", grammar=SELECT_GRAMMAR, max_tokens=40, temperature=0.0)

    state = query.run(backend=sgl.Runtime.from_engine(engine))
    lark.Lark(SELECT_GRAMMAR, parser="lalr").parse(state["sql"])


def test_dsl_gen_refuses_two_constraints():
    with pytest.raises(sgl.ProgramError, match="at most one"):
        sgl.gen("x", grammar=SELECT_GRAMMAR, regex="a")
