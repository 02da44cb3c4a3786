"""grammar.Constraint, the one compile entry point and its cache, and the matcher base every
compiled kind's matcher derives from."""

from __future__ import annotations

import json

import pytest

import grammar
from grammar import Constraint, ConstraintError, GrammarError, TokenVocabulary
from grammar.tokens.matcher import MatcherBase

EOS, SPECIAL = 0, 1
PIECES = ["a", "b", "ab", "{", "}", '"', ":", ",", "x", "1", "2", " ", "hi", "yes", "no"]


@pytest.fixture(scope="module")
def vocab() -> TokenVocabulary:
    data: list[bytes | None] = [None, None] + [p.encode() for p in PIECES]
    return TokenVocabulary(data, [EOS], [SPECIAL])


def tok(piece: str) -> int:
    return 2 + PIECES.index(piece)


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_equal_constraints_from_every_spelling_are_one_value():
    text = json.dumps(SCHEMA)
    values = [
        Constraint.of("json_schema", SCHEMA, json_schema_mode="exact"),
        Constraint.from_fields(json_schema=text, json_schema_mode="exact"),
        Constraint.from_kwargs({"json_schema": SCHEMA, "temperature": 0}, default_mode="exact"),
    ]
    assert all(v == values[0] and hash(v) == hash(values[0]) for v in values)
    assert Constraint.from_wire(values[0].wire()) == values[0]
    # a different mode is a different constraint; a mode on a regex is not kept
    assert Constraint.from_fields(json_schema=SCHEMA) != values[0]
    assert Constraint.from_fields(regex="a+", json_schema_mode="exact") == Constraint.of(
        "regex", "a+"
    )
    # dtype by type or by name; choices as a list or a tuple; a tag as dict or JSON text
    assert Constraint.of("dtype", int) == Constraint.of("dtype", "int")
    assert Constraint.of("choices", ["yes", "no"]) == Constraint.of("choices", ("yes", "no"))
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}
    assert Constraint.of("structural_tag", json.dumps(tag)) == Constraint.of("structural_tag", tag)


def test_no_constraint_is_none():
    assert Constraint.from_fields() is None
    assert Constraint.from_kwargs({"temperature": 0.5, "regex": None}) is None


@pytest.mark.parametrize(
    "fields, field, words",
    [
        ({"regex": "a", "choices": ["b"]}, "regex", ["regex", "choices"]),
        ({"json_schema": {}, "ebnf": "root ::= 'a'"}, "json_schema", ["json_schema", "ebnf"]),
        ({"dtype": "complex"}, "dtype", ["dtype", "complex"]),
        ({"dtype": list}, "dtype", ["dtype"]),
        ({"regex": "a", "json_schema_mode": "loose"}, "json_schema_mode", ["json_schema_mode"]),
        ({"json_schema_mode": "loose"}, "json_schema_mode", ["loose"]),
        ({"structural_tag": "{not json"}, "structural_tag", ["structural_tag", "JSON"]),
        ({"choices": "yes"}, "choices", ["choices"]),
    ],
)
def test_a_misstated_constraint_is_refused_naming_the_field(fields, field, words):
    with pytest.raises(ConstraintError) as err:
        Constraint.from_fields(**fields)
    assert err.value.field == field
    assert isinstance(err.value, ValueError)  # what the engine's callers catch
    for w in words:
        assert w in str(err.value)


def test_one_cache_whichever_entry_point_compiles(vocab):
    grammar.clear_caches()
    by_wrapper = grammar.compile_json_schema(SCHEMA, vocab, json_schema_mode="strict")
    by_value = grammar.compile(Constraint.from_fields(json_schema=json.dumps(SCHEMA)), vocab)
    assert by_value is by_wrapper
    assert grammar.compile_choices(["yes", "no"], vocab) is grammar.compile(
        Constraint.of("choices", ("yes", "no")), vocab
    )
    lark = 'start: "a" "b"'
    assert grammar.compile_lark(lark, vocab) is grammar.compile(
        Constraint.of("grammar", lark), vocab
    )
    gbnf = 'root ::= "a" root | "b"'
    assert grammar.compile_ebnf(gbnf, vocab) is grammar.compile(
        Constraint.from_wire(Constraint.of("ebnf", gbnf).wire()), vocab
    )
    grammar.clear_caches()  # one call empties it
    again = grammar.compile(Constraint.from_fields(json_schema=SCHEMA), vocab)
    assert again is not by_wrapper and again.matcher().bitmask().any()


def test_compile_refuses_empty_choices(vocab):
    with pytest.raises(GrammarError, match="choices must not be empty"):
        grammar.compile(Constraint.of("choices", []), vocab)


def _matchers(vocab):
    """A matcher of each compiled kind over `vocab`, each accepting exactly "ab"."""
    return {
        "dfa": grammar.compile_regex("ab", vocab).matcher(),
        "lark": grammar.compile_lark('start: "a" "b"', vocab).matcher(),
        "gbnf": grammar.compile_ebnf('root ::= "a" root "b" | "ab"', vocab).matcher(),
    }


@pytest.mark.parametrize("kind", ["dfa", "lark", "gbnf"])
def test_every_matcher_shares_the_base_checks(vocab, kind):
    m = _matchers(vocab)[kind]
    assert isinstance(m, MatcherBase)
    with pytest.raises(GrammarError, match="outside the vocabulary"):
        m.advance(len(vocab))
    with pytest.raises(GrammarError, match="special or empty"):
        m.advance(SPECIAL)
    with pytest.raises(GrammarError, match="incomplete"):
        m.advance(EOS)
    with pytest.raises(GrammarError, match="not allowed here"):
        m.advance(tok("b"))
    with pytest.raises(GrammarError, match="not allowed here"):
        m.advance_bytes(b"x")
    assert not m.is_accepting() and not m.is_allowed(EOS)
    m.advance(tok("a"))
    c = m.copy()
    m.advance(tok("b"))
    assert m.is_accepting() and m.is_allowed(EOS)
    assert not c.is_accepting()  # the copy stayed where it was
    m.advance(EOS)
    assert m.is_dead() and not m.bitmask().any() and m.forced_bytes() == b""
    with pytest.raises(GrammarError, match="already ended"):
        m.advance(tok("a"))
    with pytest.raises(GrammarError, match="already ended"):
        m.advance_bytes(b"a")
    m.advance_bytes(b"")  # nothing to consume: no error


def test_the_gbnf_matcher_rolls_back_through_the_shared_advance(vocab):
    m = _matchers(vocab)["gbnf"]
    m.advance(tok("a"))
    m.advance_bytes(b"ab")
    m.advance(tok("b"))
    m.advance(EOS)
    assert m.is_dead()
    m.rollback(2)  # EOS and the last "b"
    assert not m.is_dead() and not m.is_accepting() and m.is_allowed(tok("b"))
    m.advance(tok("b"))
    assert m.is_accepting()


def test_the_wire_form_keeps_the_order_of_keys():
    """Property order is output order: a schema inside a structural tag crosses to the compile
    worker with its properties as written, not sorted."""
    schema = {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "string"}}}
    tag = {
        "type": "structural_tag",
        "format": {"type": "tag", "begin": "<f>", "content": {"type": "json_schema",
                   "json_schema": schema}, "end": "</f>"},
    }  # fmt: skip
    back = Constraint.from_wire(Constraint.of("structural_tag", tag).wire()).value
    assert list(back["format"]["content"]["json_schema"]["properties"]) == ["z", "a"]
    assert list(back) == list(tag)
    again = Constraint.from_wire(Constraint.of("json_schema", schema).wire()).value
    assert list(again["properties"]) == ["z", "a"]
