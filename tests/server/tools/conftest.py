"""Fixtures the tool tests share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def walk():
    """`walk(constraint, text)`: whether the constraint (`regex` or `structural_tag`), compiled
    over SmolLM2's vocabulary, takes the tokens of `text` one by one and accepts at the end."""
    from grammar import compile_regex, compile_structural_tag
    from grammar.tokens.vocab import TokenVocabulary
    from tests.support.tiny_models import smollm_tokenizer
    from tests.support.walks import accepts_text

    tok = smollm_tokenizer()
    vocab = TokenVocabulary.from_tokenizer(tok)

    def run(constraint: dict, text: str) -> bool:
        if "regex" in constraint:
            g = compile_regex(constraint["regex"], vocab)
        else:
            g = compile_structural_tag(constraint["structural_tag"], vocab)
        return accepts_text(g, tok, text)

    return run
