"""A grammar naming a special token, served by the engine (tiny random Llama, SmolLM2's
tokenizer): the special token is generated where the grammar names it and stays in the output
when jump-forward re-tokenises the forced text after it."""

from __future__ import annotations

import pytest

from runtime import Engine
from tests.support.tiny_models import make_tiny_model

IM_START = 1  # SmolLM2's <|im_start|>


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-token-terminals"), seed=3)
    with Engine(folder, page_size=4, max_total_tokens=4096) as e:
        yield e


@pytest.mark.parametrize("jump", [True, False])
def test_a_special_token_named_by_the_grammar_is_generated_and_kept(engine, jump) -> None:
    grammar = 'start: "Say" <|im_start|> " forced text after it" /[a-z]/'
    r = engine.generate("Hello", grammar=grammar, max_new_tokens=40, temperature=1.0, seed=2,
                        jump_forward=jump)  # fmt: skip
    assert r.finish_reason == "stop", (r.text, r.error)
    ids = r.token_ids
    assert ids.count(IM_START) == 1
    at = ids.index(IM_START)
    tok = engine.tokenizer
    assert tok.decode(ids[:at]) == "Say"
    tail = tok.decode(ids[at + 1 :])
    assert (
        tail.startswith(" forced text after it") and len(tail) == len(" forced text after it") + 1
    )
    engine.check_integrity()
