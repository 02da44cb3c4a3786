"""Many literal values (a large `enum`) as one automaton: a trie of their JSON texts.

An enum of n strings as a regex is n alternatives: its NFA start reaches n branches, and every
lazily built DFA state near the start is a set of thousands of NFA states (a 100,000-value
enum took tens of seconds, and gigabytes, to compile and mask). The values' texts as a trie are
a DFA outright: one state per distinct prefix, built in one pass over the bytes, with a byte
class per byte used.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from grammar.automata import dfa_ops
from grammar.automata.fsm import DEAD, START, ByteDFA
from grammar.automata.regex_ast import regex_escape

TRIE_MIN_VALUES = 256  # from this many literal values on, an enum is a trie


def literal_trie(texts: list[bytes]) -> ByteDFA:
    """The DFA matching exactly the byte strings `texts` (states: DEAD, START, then one per
    distinct non-empty prefix)."""
    children: dict[int, int] = {}  # (state << 8) | byte -> state
    accepting = [False, False]
    for text in texts:
        state = START
        for byte in text:
            key = (state << 8) | byte
            nxt = children.get(key)
            if nxt is None:
                nxt = len(accepting)
                accepting.append(False)
                children[key] = nxt
            state = nxt
        accepting[state] = True
    keys = np.fromiter(children.keys(), dtype=np.int64, count=len(children))
    targets = np.fromiter(children.values(), dtype=np.int32, count=len(children))
    used = np.unique(keys & 0xFF)
    byte_to_class = np.zeros(256, dtype=np.int32)  # class 0: bytes no text has, dead
    byte_to_class[used] = np.arange(1, used.size + 1, dtype=np.int32)
    table = np.full((len(accepting), used.size + 1), DEAD, dtype=np.int32)
    table[keys >> 8, byte_to_class[keys & 0xFF]] = targets
    return ByteDFA(table, byte_to_class, np.array(accepting, dtype=bool))


def single_spelling(values: list) -> bool:
    """Whether each value has one JSON text only (strings, booleans, null: numbers have their
    other spellings, 2 == 2.0, and objects their member orders)."""
    return all(v is None or isinstance(v, str | bool) for v in values)


def literals_node(values: list[Any], pointer: str) -> object | None:
    """The JSON texts of `values` (single_spelling) as one automaton leaf, keeping the regex
    text of their alternation for json_schema_to_regex; None for no values."""
    texts = list(dict.fromkeys(json.dumps(v, ensure_ascii=False) for v in values))
    if not texts:
        return None
    dfa = literal_trie([t.encode() for t in texts])
    text = "(" + "|".join(regex_escape(t) for t in texts) + ")"
    return dfa_ops.DFANode(dfa, "enum", pointer, text)
