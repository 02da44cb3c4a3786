"""Token walks through a compiled grammar, and the brute-force mask the packed masks must equal."""

from __future__ import annotations

from typing import Any

from tests.support.json_text import compact


def walk(grammar: Any, token_ids: list[int]) -> bool:
    """Feed tokens through mask()/advance(): True iff every token is allowed by the packed mask
    and the end is accepting (EOS allowed)."""
    m = grammar.matcher()
    for t in token_ids:
        if not m.is_allowed(t):
            return False
        m.advance(t)
    eos = grammar.vocab.eos_token_ids
    return m.is_accepting() and (not eos or m.is_allowed(eos[0]))


def accepts_text(grammar: Any, tok: Any, text: str) -> bool:
    """Whether `grammar` takes the tokenizer's encoding of `text` token by token (each allowed
    by the packed mask) and accepts at the end."""
    m = grammar.matcher()
    for t in tok(text, add_special_tokens=False).input_ids:
        if not m.is_allowed(t):
            return False
        m.advance(t)
    return m.is_accepting()


def accepts_bytes(grammar: Any, text: str) -> bool:
    """Feed `text`'s bytes one by one through advance_bytes(): True iff none is refused and the
    matcher ends accepting."""
    from grammar.errors import GrammarError

    m = grammar.matcher()
    for b in text.encode():
        try:
            m.advance_bytes(bytes([b]))
        except GrammarError:
            return False
    return bool(m.is_accepting())


def brute_force_mask(grammar: Any, state: int) -> Any:
    """Token by token in Python: the reference the vectorised masks must equal."""
    import numpy as np

    vocab, dfa = grammar.vocab, grammar.dfa
    out = np.zeros(len(vocab), dtype=bool)
    for i in range(len(vocab)):
        b = vocab.token_bytes(i)
        out[i] = bool(b) and dfa.walk(state, b) != 0
    for e in vocab.eos_token_ids:
        out[e] = bool(dfa.accepting[state])
    return out


def assert_masks_on_walks_match(grammar: Any, tok: Any, instances: list, n_states: int) -> None:
    """Walk each instance (compact JSON) to its accepting end, then check the packed masks of
    the first `n_states` states visited against brute_force_mask."""
    import numpy as np

    states: list[int] = []
    for instance in instances:
        m = grammar.matcher()
        for t in tok.encode(compact(instance), add_special_tokens=False):
            if m.state not in states:
                states.append(m.state)
            m.advance(t)
        assert m.is_accepting(), instance
    n = len(grammar.vocab)
    for state in states[:n_states]:
        words = grammar.index.bitmask(state)
        got = np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)
        assert np.array_equal(got, brute_force_mask(grammar, state)), state
