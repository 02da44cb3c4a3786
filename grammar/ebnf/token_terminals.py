"""Terminals that match one token by its id (`grammar.ebnf.syntax.TokenSet`), never by its text.

XGrammar's `Token(...)` / `ExcludeToken(...)` / `TokenTagDispatch(...)` and token-level structural
tag formats, and llguidance's special tokens (`<|im_end|>`, `<[12]>`, `<[1-5,9]>`, `<[^3]>`,
`<[*]>`) name tokens, not bytes: a special token has no text a byte matcher could read, and a
text token named by id is that token only (its bytes spelled by other tokens do not match).

A token terminal sits in the Earley network like a byte terminal, with a byte table that reads
nothing: byte steps, forced text and the decomposition of tokens (which only ever start a byte
terminal) pass it by. Where the parser can take it, its ids join the mask whole
(`CompiledEBNF.bitmask`), and a token in its set advances past it (`EarleyParser.advance_token`;
a text token in the set may also go on as text: both continuations are kept). A token terminal
starts only at a token boundary: the mask's hypothetical sets inside a token skip it.

Resolution against the vocabulary: a name is looked up in `TokenVocabulary.token_names` (the
tokenizer's added and special tokens by text), else it must be the text of exactly one token's
bytes; ids must be inside the vocabulary. Anything else is a GrammarError naming the token and
where it was written. A negated set (and a wildcard) never holds an EOS id: EOS ends the
constraint where its text is a sentence, as everywhere else.
"""

from __future__ import annotations

import numpy as np

from grammar.automata.fsm import DEAD
from grammar.ebnf.syntax import TokenSet
from grammar.errors import GrammarError
from grammar.tokens.vocab import TokenVocabulary


class TokenTerminal:
    """A terminal over token ids: `member[id]`, the ids, their packed mask (int32 words); the
    byte-terminal fields (`table`, `accepting`, `live`, ...) say it reads no byte."""

    __slots__ = (
        "key",
        "ids",
        "member",
        "words",
        "table",
        "accepting",
        "live",
        "nullable",
        "first_bytes",
    )

    def __init__(self, key: object, ids: np.ndarray, num_tokens: int, num_words: int) -> None:
        self.key = key
        self.ids = ids
        member = np.zeros(num_words * 32, dtype=bool)
        member[ids] = True
        self.member = member[:num_tokens]
        # bit i of word i >> 5 is token i: little-endian bytes of little-endian bit order
        self.words = np.packbits(member, bitorder="little").view("<i4").astype(np.int32)
        self.table = np.full((2, 256), DEAD, dtype=np.int32)
        self.accepting = np.zeros(2, dtype=bool)
        self.live = np.zeros(2, dtype=bool)
        self.nullable = False
        self.first_bytes = np.zeros(256, dtype=bool)


def _name_id(name: str, vocab: TokenVocabulary, where: str) -> int:
    hit = vocab.token_names.get(name)
    if hit is not None:
        return hit
    data = name.encode("utf-8")
    found = [i for i in _ids_with_bytes(vocab, data)]
    if len(found) == 1:
        return found[0]
    if found:
        raise GrammarError(
            f"{where}: the token {name!r} is ambiguous: ids {found[:8]} all have that text"
        )
    raise GrammarError(f"{where}: the vocabulary has no token {name!r}")


def _ids_with_bytes(vocab: TokenVocabulary, data: bytes) -> list[int]:
    index = vocab.derived(("ids-by-bytes",), lambda: _bytes_index(vocab))
    return index.get(data, [])


def _bytes_index(vocab: TokenVocabulary) -> dict[bytes, list[int]]:
    out: dict[bytes, list[int]] = {}
    for i in range(len(vocab)):
        b = vocab.token_bytes(i)
        if b:
            out.setdefault(b, []).append(i)
    return out


def resolve(ts: TokenSet, vocab: TokenVocabulary) -> np.ndarray:
    """The sorted token ids a `TokenSet` matches in `vocab` (GrammarError naming what is not
    in it, or a set that matches no token)."""
    n = len(vocab)
    where = ts.where or "token"
    chosen = np.zeros(n, dtype=bool)
    for item in ts.items:
        if isinstance(item, str):
            chosen[_name_id(item, vocab, where)] = True
            continue
        lo, hi = item
        if hi is None:
            hi = n - 1
        if lo < 0 or lo > hi:
            raise GrammarError(f"{where}: bad token id range {lo}-{hi}")
        if hi >= n:
            raise GrammarError(
                f"{where}: token id {hi} is outside the vocabulary ({n} ids, 0-{n - 1})"
            )
        chosen[lo : hi + 1] = True
    if ts.negated:
        chosen = ~chosen
        chosen[list(vocab.eos_token_ids)] = False
    ids = np.flatnonzero(chosen).astype(np.int64)
    if not ids.size:
        raise GrammarError(f"{where}: the token set matches no token of the vocabulary")
    return ids


def token_terminal(ts: TokenSet, vocab: TokenVocabulary, num_words: int) -> TokenTerminal:
    ids = resolve(ts, vocab)
    return TokenTerminal(("tokens", ids.tobytes()), ids, len(vocab), num_words)
