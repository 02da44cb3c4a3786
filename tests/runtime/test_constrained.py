"""Constrained decoding in the engine (tiny random Llama, SmolLM2's tokenizer): every finished
output validates, jump-forward keeps token ids canonical and saves steps, bad constraints
fail alone."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from runtime import Engine
from tests.support.tiny_models import make_tiny_model

SCHEMAS = {
    "flat": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "alive": {"type": "boolean"},
        },
        "required": ["name", "age", "alive"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "city": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 5},
                    "pop": {"type": "integer", "minimum": 0, "maximum": 9999},
                },
                "required": ["name", "pop"],
                "additionalProperties": False,
            }
        },
        "required": ["city"],
        "additionalProperties": False,
    },
    "array": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 99},
        "minItems": 1,
        "maxItems": 4,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"const": "XL"}},
        "required": ["color", "size"],
        "additionalProperties": False,
    },
    "optional": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "boolean"},
        },
        "required": ["a"],
        "additionalProperties": False,
    },
    "pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
        "required": ["code"],
        "additionalProperties": False,
    },
    "numeric-bounds": {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 10, "maximum": 20},
            "x": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["n", "x"],
        "additionalProperties": False,
    },
    "ref": {
        "$defs": {"pt": {"type": "object", "properties": {"x": {"enum": [0, 1]}, "y": {
            "enum": [0, 1]}}, "required": ["x", "y"], "additionalProperties": False}},
        "type": "object",
        "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}},
        "required": ["from", "to"],
        "additionalProperties": False,
    },
}  # fmt: skip

REGEXES = {
    "phone": r"\d{3}-\d{4}",
    "date": r"20\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d)",
    "word-list": r"(cat|dog|bird)(, (cat|dog|bird)){0,3}",
    "email": r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)",
}

PROMPT = "Give me the data:"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny-constrained"), seed=5)
    with Engine(folder, page_size=4, max_total_tokens=8192) as e:
        yield e


@pytest.mark.parametrize("name", list(SCHEMAS))
@pytest.mark.parametrize("sampling", ["greedy", "sampled"])
def test_schema_outputs_validate(engine, name, sampling):
    kw = dict(temperature=0.0) if sampling == "greedy" else dict(temperature=1.0, seed=3)
    prompts = [f"{PROMPT} {i}" for i in range(3)]
    for jump in (True, False):
        results = engine.generate(prompts, json_schema=SCHEMAS[name], max_new_tokens=120,
                                  jump_forward=jump, **kw)  # fmt: skip
        for r in results:
            assert r.finish_reason == "stop", (r.text, r.error)
            jsonschema.validate(json.loads(r.text), SCHEMAS[name])
    engine.check_integrity()


@pytest.mark.parametrize("name", list(REGEXES))
def test_regex_outputs_match(engine, name):
    results = engine.generate([PROMPT, PROMPT + " x"], regex=REGEXES[name], max_new_tokens=60,
                              temperature=0.9, seed=1)  # fmt: skip
    for r in results:
        assert r.finish_reason == "stop"
        assert re.fullmatch(REGEXES[name], r.text), r.text


@pytest.mark.parametrize(
    ("dtype", "check"),
    [
        pytest.param(int, lambda t: int(t) is not None, id="int"),
        pytest.param(float, lambda t: float(t) is not None, id="float"),
        pytest.param(bool, lambda t: t in ("True", "False"), id="bool"),
        pytest.param("int", lambda t: re.fullmatch(r"-?\d+", t), id="int-by-name"),
    ],
)
def test_dtype_outputs_parse(engine, dtype, check):
    r = engine.generate(PROMPT, dtype=dtype, max_new_tokens=40, temperature=0.0)
    assert r.finish_reason == "stop", r.text
    assert check(r.text)


def test_dtype_str_is_a_json_string(engine):
    # a random model rarely closes the string: a "length" output is a valid prefix
    r = engine.generate(PROMPT, dtype=str, max_new_tokens=20, temperature=0.0)
    assert r.text.startswith('"')
    if r.finish_reason == "stop":
        assert isinstance(json.loads(r.text), str)


def test_choices_pick_one_of_them(engine):
    choices = ["apple pie", "banana", "cherry tart"]
    for seed in range(3):
        r = engine.generate(PROMPT, choices=choices, temperature=1.0, seed=seed)
        assert r.text in choices and r.finish_reason == "stop"


def test_jump_forward_ids_are_the_tokenizer_encoding(engine):
    regex = r'\{"answer": "(yes|no)", "confidence": "(high|low)", "checked": true\}'
    r = engine.generate(PROMPT, regex=regex, max_new_tokens=60, temperature=0.0)
    off = engine.generate(PROMPT, regex=regex, max_new_tokens=60, temperature=0.0,
                          jump_forward=False)  # fmt: skip
    assert re.fullmatch(regex, r.text) and re.fullmatch(regex, off.text)
    # the output ends with a jump, so its ids are exactly the tokenizer's encoding of the text
    assert r.token_ids == engine.tokenizer.encode(r.text, add_special_tokens=False)
    assert r.usage.decode_steps < off.usage.decode_steps
    assert r.usage.completion_tokens < off.usage.completion_tokens  # canonical = fewer tokens


def test_jump_forward_logprobs_align_with_tokens(engine):
    regex = r'\{"k": (1|2), "fixed": "constant text here"\}'
    r = engine.generate(PROMPT, regex=regex, max_new_tokens=60, temperature=0.0, logprobs=True)
    assert re.fullmatch(regex, r.text)
    assert len(r.logprobs) == len(r.token_ids)
    assert all(lp <= 0.0 for lp in r.logprobs)


def test_stream_text_is_consistent_across_jumps(engine):
    regex = r'\{"k": (1|2), "fixed": "constant text here"\}'
    chunks = list(engine.generate(PROMPT, regex=regex, max_new_tokens=60, temperature=0.0,
                                  stream=True))  # fmt: skip
    final = chunks[-1].result
    assert "".join(c.text_delta for c in chunks) == final.text
    assert [t for c in chunks for t in c.token_ids] == final.token_ids
    assert re.fullmatch(regex, final.text)


def test_max_new_tokens_before_acceptance_says_so(engine):
    r = engine.generate(PROMPT, regex=r"[a-z]{30}", max_new_tokens=5, temperature=0.0,
                        jump_forward=False)  # fmt: skip
    assert r.finish_reason == "length" and len(r.token_ids) == 5
    assert "before the constraint was complete" in r.error


def test_jumped_tokens_count_against_max_new_tokens(engine):
    regex = r"(a|b) this is a long forced tail of text that will not fit"
    r = engine.generate(PROMPT, regex=regex, max_new_tokens=4, temperature=0.0)
    assert r.finish_reason == "length" and len(r.token_ids) == 4


def test_eos_only_when_accepting(engine):
    r = engine.generate(PROMPT, regex=r"(ab)+", max_new_tokens=30, temperature=1.0, seed=0)
    assert re.fullmatch(r"(ab)+", r.text) and r.finish_reason in ("stop", "length")


def test_bad_constraints_fail_alone(engine):
    from grammar import GrammarError

    prompts = [PROMPT, PROMPT + " 1", PROMPT + " 2"]
    plain = engine.generate(prompts[0], max_new_tokens=8, temperature=0.0, ignore_eos=True)
    with pytest.raises(GrammarError):
        engine.generate(PROMPT, regex="(unclosed", max_new_tokens=8)
    results = engine.generate(prompts, regex=None, max_new_tokens=8, temperature=0.0,
                              ignore_eos=True)  # fmt: skip
    mixed = [engine.generate(prompts, max_new_tokens=8, temperature=0.0, ignore_eos=True)]
    assert results[0].token_ids == plain.token_ids == mixed[0][0].token_ids


def test_impossible_constraint_mid_batch_does_not_disturb_others(engine):
    import threading

    outs: dict[str, object] = {}

    def bad() -> None:
        try:
            outs["bad"] = engine.generate(PROMPT + " bad", regex="(unclosed", max_new_tokens=8)
        except Exception as exc:  # expected
            outs["bad"] = exc

    plain = engine.generate(PROMPT, max_new_tokens=10, temperature=0.0, ignore_eos=True)
    t = threading.Thread(target=bad)
    t.start()
    good = engine.generate([PROMPT, PROMPT], max_new_tokens=10, temperature=0.0, ignore_eos=True,
                           regex=None)  # fmt: skip
    t.join()
    assert [g.token_ids for g in good] == [plain.token_ids] * 2
    assert isinstance(outs["bad"], Exception)
    engine.check_integrity()


def test_unconstrained_rows_are_untouched_by_constrained_neighbours(engine):
    plain = engine.generate(PROMPT, max_new_tokens=10, temperature=0.0, ignore_eos=True)
    import threading

    box = {}
    t = threading.Thread(
        target=lambda: box.setdefault(
            "c",
            engine.generate(
                PROMPT + " c", json_schema=SCHEMAS["flat"], max_new_tokens=60, temperature=0.0
            ),
        )
    )
    t.start()
    again = engine.generate(PROMPT, max_new_tokens=10, temperature=0.0, ignore_eos=True)
    t.join()
    assert again.token_ids == plain.token_ids
    jsonschema.validate(json.loads(box["c"].text), SCHEMAS["flat"])


def test_compile_time_is_reported(engine):
    r = engine.generate(PROMPT, json_schema=SCHEMAS["nested"], max_new_tokens=80,
                        temperature=0.0)  # fmt: skip
    assert r.usage.compile_time_s >= 0.0 and r.finish_reason == "stop"


def test_list_entry_with_bad_constraint_is_aborted(engine):
    results = engine.generate([PROMPT, PROMPT], regex="(unclosed", max_new_tokens=4)
    assert all(r.finish_reason == "abort" and r.error for r in results)


def test_state_budget_reached_mid_generation_fails_that_request_alone(engine, monkeypatch):
    """A lazily built automaton numbers states as the walk goes: one that reaches its budget
    mid-generation aborts its own request with the GrammarError; the batch goes on."""
    import grammar
    from grammar.tokens.compiled import CompiledGrammar

    init = CompiledGrammar.__init__

    def tiny_budget(self, dfa, *args, **kwargs):  # where the serving process rebuilds it
        init(self, dfa, *args, **kwargs)
        if dfa.lazy:
            dfa.max_states = dfa.num_states + 3

    monkeypatch.setattr(CompiledGrammar, "__init__", tiny_budget)
    grammar.clear_caches()
    engine.scheduler.hooks.compiles.clear()
    plain = engine.generate(PROMPT, max_new_tokens=10, temperature=0.0, ignore_eos=True)
    # a long unconstrained request is in flight (streamed: submitted at once) while the
    # constrained one reaches the budget; a DFA that remembers the last 9 letters: 512 states
    stream = engine.generate(PROMPT, max_new_tokens=80, temperature=0.0, ignore_eos=True,
                             stream=True)  # fmt: skip
    (r,) = engine.generate([PROMPT + " bad"], regex="[ab]*a[ab]{8}", max_new_tokens=30,
                           temperature=1.0, seed=3, ignore_eos=True)  # fmt: skip
    chunks = list(stream)
    grammar.clear_caches()
    engine.scheduler.hooks.compiles.clear()
    assert r.finish_reason == "abort" and "state budget" in r.error, (r.finish_reason, r.error)
    final = chunks[-1].result
    assert final.finish_reason == "length" and final.token_ids[:10] == plain.token_ids
    engine.check_integrity()


def test_grammar_error_while_advancing_aborts_only_that_request(engine):
    """The advance path: a matcher that fails on the sampled token (e.g. the state budget
    reached while reading the state it leads to) finishes its request with the error."""
    from types import SimpleNamespace

    from grammar import GrammarError

    class Failing:
        def advance(self, token_id: int) -> None:
            raise GrammarError("DFA exceeds the state budget (3 states)")

    hooks = engine.scheduler.hooks
    req = SimpleNamespace(
        constraint=SimpleNamespace(matcher=Failing(), jump_forward=False),
        output_ids=[5],
        error=None,
        finish_reason=None,
    )
    hooks.after_token(engine.scheduler, req)
    assert req.finish_reason == "abort" and "state budget" in str(req.error)
