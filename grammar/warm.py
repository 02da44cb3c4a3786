"""The per-vocabulary token sets most JSON constraints share, built at start (`grammar.prebuild`)
instead of in some request's first mask.

A state inside a JSON string loops on the string's characters: its mask is a shared set (the
tokens made of them, `loops.transparent_set`); a string with maxLength is a counting chain, and
its mask a shared layout (`chains.chain_layout`: each token's count of string characters).
Both depend only on the vocabulary and the character set, and are kept on the vocabulary
(`TokenVocabulary.derived`), but the first constraint that reads one builds it: ~60 ms for the
chain layout at 49k ids, paid by that request's mask. Here they are built by computing the
masks of a few small constraints that reach those states, so the sets land under the same keys
a request's would.
"""

from __future__ import annotations

from grammar.api import compile_json_schema
from grammar.automata.lazy_dfa import START
from grammar.tokens.vocab import TokenVocabulary

# what reaches the shared states: a string's content, a string with maxLength (a chain whose
# characters are every whole character; its mask is read from the state after the quote)
_SCHEMAS = ({"type": "string"}, {"type": "string", "maxLength": 64})


def prebuild(vocab: TokenVocabulary) -> None:
    """Build the shared token sets of JSON string content over `vocab` (~0.1 s at 49k ids;
    a no-op once built)."""
    for schema in _SCHEMAS:
        grammar = compile_json_schema(schema, vocab)
        dfa, index = grammar.dfa, grammar.index
        index.bitmask(START)
        inside = dfa.walk(START, b'"')
        if inside:
            index.bitmask(inside)
