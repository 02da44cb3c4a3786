"""Speculation under constraints: drafts pass through the request's grammar first, the matcher
advances only over accepted tokens, jump-forward text is verified with the drafts after it;
outputs validate (jsonschema, re, lark) and equal the same engine's without speculation."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from grammar.tokens.vocab import TokenVocabulary  # noqa: F401  (the grammar package loads)
from runtime.speculative.speculator import grammar_prefix

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
    },
    "required": ["name", "tags", "n"],
    "additionalProperties": False,
}
PROMPT = 'Record: {"name": "ab", "tags": ["red", "blue"], "n": 12}. Again: '
LARK = 'start: item ("," item)*\nitem: "x" | "yy" | NUM\nNUM: /[0-9]{1,2}/\n'
CASES = [
    ({"json_schema": json.dumps(SCHEMA)}, lambda t: jsonschema.validate(json.loads(t), SCHEMA)),
    (
        {"json_schema": json.dumps(SCHEMA), "jump_forward": False},
        lambda t: jsonschema.validate(json.loads(t), SCHEMA),
    ),
    (
        {"regex": r"(ab|cd){2,6}-[0-9]{2}"},
        lambda t: re.fullmatch(r"(ab|cd){2,6}-[0-9]{2}", t) or pytest.fail(t),
    ),
    (
        {"grammar": LARK},
        lambda t: re.fullmatch(r"(x|yy|[0-9]{1,2})(,(x|yy|[0-9]{1,2}))*", t) or pytest.fail(t),
    ),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("wrong_every", [None, 0, 2])
def test_constrained_outputs_validate_and_match(engines, oracle, case, wrong_every):
    """None: the n-gram proposer; 0: perfect drafts; 2: every second draft wrong."""
    base, spec = engines
    kw, check = CASES[case]
    a = base.generate(PROMPT, max_new_tokens=60, temperature=0.0, **kw)
    if wrong_every is not None:
        oracle([a.prompt_token_ids + a.token_ids], wrong_every)
    b = spec.generate(PROMPT, max_new_tokens=60, temperature=0.0, **kw)
    assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
    if a.finish_reason == "stop":
        check(b.text)
    spec.check_integrity()


def test_sampled_constrained_outputs_validate(engines, oracle):
    base, spec = engines
    a = base.generate(PROMPT, max_new_tokens=80, temperature=0.0, json_schema=SCHEMA)
    oracle([a.prompt_token_ids + a.token_ids], 3)
    outs = spec.generate([PROMPT] * 4, max_new_tokens=80, temperature=1.0,
                         json_schema=json.dumps(SCHEMA))  # fmt: skip
    for out in outs:
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(out.text), SCHEMA)
        else:
            assert out.finish_reason == "length"


def test_drafts_are_cut_at_the_first_token_the_grammar_refuses(engines):
    spec = engines[1]
    tok = spec.tokenizer
    hooks = spec.scheduler.hooks

    class Constraint:
        jump_forward = False

    from grammar import compile_regex

    Constraint.matcher = compile_regex(r"ab(cd)+", hooks.vocab()).matcher()
    good = tok.encode("abcdcd", add_special_tokens=False)
    bad = tok.encode("abX", add_special_tokens=False)
    assert grammar_prefix(Constraint, good) == good
    kept = grammar_prefix(Constraint, good[:1] + bad[-1:] + good[1:])
    assert kept == good[:1]
    # walked on a copy: the request's matcher has not moved
    assert Constraint.matcher.is_allowed(good[0])


@pytest.mark.parametrize("wrong_every", [0, 2])
def test_bias_and_penalties_toward_refused_tokens_match(engines, oracle, wrong_every):
    """A verify row's greedy token is read from the unmasked row when the grammar allows it:
    a logit bias making refused tokens the row's maximum, a repetition penalty and an end
    token banned by min_new_tokens must give the masked row's token, as decoding does."""
    base, spec = engines
    tok = spec.tokenizer
    refused = tok.encode("Z!", add_special_tokens=False)
    allowed = tok.encode("cd", add_special_tokens=False)
    kw = {"regex": r"(ab|cd){2,6}-[0-9]{2}", "logit_bias": {refused[0]: 100.0,
          refused[-1]: 60.0, allowed[0]: 5.0}, "repetition_penalty": 1.3,
          "min_new_tokens": 4}  # fmt: skip
    a = base.generate(PROMPT, max_new_tokens=40, temperature=0.0, **kw)
    oracle([a.prompt_token_ids + a.token_ids], wrong_every)
    verifies = spec.stats()["spec_verify_steps"]
    b = spec.generate(PROMPT, max_new_tokens=40, temperature=0.0, **kw)
    assert b.token_ids == a.token_ids and b.finish_reason == a.finish_reason
    assert re.fullmatch(r"(ab|cd){2,6}-[0-9]{2}", b.text) or a.finish_reason == "length"
    assert spec.stats()["spec_verify_steps"] > verifies
    spec.check_integrity()
