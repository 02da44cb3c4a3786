"""The eager start of a lazy NFA build (`grammar.automata.nfa`: a small tree is built whole at
compile time) stops where it would cost a first mask most: it defers repetitions of over
EAGER_COPIES copies (a maxLength 32767 string reserves ~1M state ids) and stops once the NFA
holds EAGER_STATES states. What it defers is the whole build's, state for state."""

from __future__ import annotations

import random

import pytest

from grammar.automata import nfa as nfa_module
from grammar.automata.fsm import DEFAULT_MAX_STATES, nfa_budget
from grammar.automata.lazy_dfa import LazyDFA
from grammar.automata.nfa import NFA
from grammar.json_schema.schema import json_schema_to_node


def _built(tree: object, lazy: bool) -> tuple[LazyDFA, NFA]:
    nfa = NFA(max_states=nfa_budget(DEFAULT_MAX_STATES))
    return LazyDFA(nfa, nfa.add_node(tree, lazy=lazy), DEFAULT_MAX_STATES), nfa


def _texts(rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(40):
        note = "".join(rng.choice('ab"\\é') for _ in range(rng.randint(0, 12)))
        out.append(
            ('{"kind":"x","note":"' + note + '","n":' + str(rng.randint(-3, 99)) + "}").encode()
        )
    return out + [b'{"kind":"y","note":"' + b"a" * 2000 + b'","n":1}', b'{"kind":"x"}']


SCHEMAS = [
    pytest.param(
        {
            "type": "object",
            "properties": {
                "kind": {"enum": ["x", "y"]},
                "note": {"type": "string", "maxLength": 32767},
                "n": {"type": "integer", "minimum": 0},
            },
            "required": ["kind"],
        },
        id="long-string",
    ),
    pytest.param(
        {
            "type": "object",
            "properties": {
                "kind": {"type": "string", "maxLength": 4000},
                "note": {"type": "string", "minLength": 2, "maxLength": 1500},
                "n": {"type": "integer"},
            },
        },
        id="two-long-strings",
    ),
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_long_repetitions_wait_for_a_walk_even_in_a_small_tree(schema: dict) -> None:
    tree = json_schema_to_node(schema)
    lazy, nfa = _built(tree, lazy=True)
    assert nfa._defer_after, "a small tree starts eager"
    assert nfa._pending and len(nfa.eps) < 20_000  # no copies reserved before a walk
    whole, _ = _built(tree, lazy=False)
    for text in _texts(random.Random(7)):
        assert lazy.matches(text) == whole.matches(text), text
        assert lazy.walk(1, text) == whole.walk(1, text), text
    assert lazy.num_states == whole.num_states


def test_the_eager_start_ends_at_the_state_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = {
        "type": "array",
        "items": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(30)}},
    }
    tree = json_schema_to_node(schema)
    _, uncapped = _built(tree, lazy=True)
    assert not uncapped._pending  # built whole under the default caps
    monkeypatch.setattr(nfa_module, "EAGER_STATES", len(uncapped.eps) // 10)
    lazy, capped = _built(tree, lazy=True)
    assert capped._pending and len(capped.eps) < len(uncapped.eps)
    whole, _ = _built(tree, lazy=False)
    text = b'[{"p3":"a","p29":"\\u00e9"},{},{"p0":""}]'
    assert lazy.matches(text) and lazy.walk(1, text) == whole.walk(1, text)
    assert not lazy.matches(text[:-1])
