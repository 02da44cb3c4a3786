"""The C trie walk of context-free first visits (grammar/cfg/native_walk.py) against the numpy
walks it replaces: the same grammar compiled with SGL_GRAMMAR_NATIVE on and off gives the same
mask, bit for bit, at every state along random sentences (lark: grammar/cfg; GBNF:
grammar/ebnf). A small vocabulary built from the sentences themselves keeps it fast while
giving tokens that cross many terminal boundaries."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from grammar import TokenVocabulary
from grammar.cfg import compiler, native_walk
from grammar.cfg.compiler import CompiledCFG
from tests.support.lark_sentences import EXAMPLES, grammar_text, valid_sentences

needs_c = pytest.mark.skipif(native_walk.LIBRARY.get() is None, reason="no C compiler")


def _vocab(texts: list[str], seed: int = 0, n: int = 1500) -> TokenVocabulary:
    """Every single byte, up to n random substrings of `texts` (2-10 bytes), one duplicate byte
    string and an EOS id."""
    rng = random.Random(seed)
    data = [t.encode() for t in texts]
    pieces: set[bytes] = set()
    for _ in range(20 * n):  # (short texts have fewer than n distinct pieces)
        if len(pieces) >= n:
            break
        d = rng.choice(data)
        i = rng.randrange(len(d))
        pieces.add(d[i : i + rng.randint(2, 10)])
    out: list[bytes | None] = [bytes([b]) for b in range(256)] + sorted(pieces)
    out += [out[300], None]  # the same bytes under two ids; EOS
    return TokenVocabulary(out, eos_token_ids=[len(out) - 1])


def _tokenize(vocab: TokenVocabulary, text: str, longest: int = 10) -> list[int]:
    """Greedy longest match over `vocab`, tokens of at most `longest` bytes (one of many
    tokenizations: any reaches deep states)."""
    ids = {vocab.token_bytes(i): i for i in range(len(vocab)) if vocab.token_bytes(i)}
    data, out, i = text.encode(), [], 0
    while i < len(data):
        n = next(k for k in range(min(longest, len(data) - i), 0, -1) if data[i : i + k] in ids)
        out.append(ids[data[i : i + n]])
        i += n
    return out


def _compile_both(monkeypatch, build):
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "0")
    slow = build()
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "1")
    fast = build()
    return slow, fast


def _same_masks_along(slow, fast, token_lists: list[list[int]]) -> int:
    """Walk both matchers along each token list, asserting equal masks; the masks compared."""
    n = 0
    for ids in token_lists:
        a, b = slow.matcher(), fast.matcher()
        for t in [*ids, None]:
            x, y = a.mask(), b.mask()
            assert np.array_equal(x, y), f"masks differ after {n} steps"
            n += 1
            if t is not None:
                a.advance(t)
                b.advance(t)
    return n


@functools.cache
def _lark_case(name: str) -> tuple[TokenVocabulary, list[list[int]]]:
    # (sql_select's sentences take ~0.5 s each to draw)
    n, depth = {"json": (12, 8), "sql_select": (4, 5)}.get(name, (5, 8))
    sentences = valid_sentences(name, n, seed=3, max_depth=depth)
    vocab = _vocab(sentences)
    return vocab, [_tokenize(vocab, s) for s in sentences]


@needs_c
@pytest.mark.parametrize("eager", [0, 300])  # vocabulary walks done at compile time
@pytest.mark.parametrize("name", EXAMPLES)
def test_lark_masks_equal_the_numpy_walk(monkeypatch, name: str, eager: int) -> None:
    vocab, token_lists = _lark_case(name)
    text = grammar_text(name)
    monkeypatch.setattr(compiler, "MAX_EAGER_WALKS", eager)
    slow, fast = _compile_both(monkeypatch, lambda: CompiledCFG(text, vocab))
    assert slow._walker is None and fast._walker is not None
    n = _same_masks_along(slow, fast, token_lists)
    assert n > 40
    # the eager pass walked the same groups either way
    assert slow.eager_walks == fast.eager_walks


@needs_c
def test_a_cut_lands_inside_tokens(monkeypatch) -> None:
    """Tokens that cross terminal boundaries (a cut inside them) are allowed by both walks: the
    mask after '(' in arithmetic allows a token spanning '1+2'."""
    text = grammar_text("arithmetic")
    vocab = TokenVocabulary([bytes([b]) for b in range(256)] + [b"1+2", b"1+", b"+("], [])
    slow, fast = _compile_both(monkeypatch, lambda: CompiledCFG(text, vocab))
    for g in (slow, fast):
        m = g.matcher()
        m.advance(ord("("))
        allowed = set(np.flatnonzero(m.mask()).tolist())
        assert {256, 257} <= allowed and 258 not in allowed


# recursive GBNF grammars (the Earley path): values in a string loop (the loop shortcut of the
# C walk), numbers whose terminal may complete inside a token, nesting
GBNF = {
    "json": r"""
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\] | "\\" ["\\/bfnrt] | "\\u" [0-9a-fA-F]{4} )* "\""
number ::= "-"? [0-9]+ ( "." [0-9]+ )?
ws     ::= [ \t\n]*
""",
    "arithmetic": r"""
root ::= expr
expr ::= term ( ws [-+] ws term )*
term ::= atom ( ws [*/] ws atom )*
atom ::= [0-9]+ | "(" ws expr ws ")" | "-" atom
ws   ::= " "?
""",
    # identifiers: an accepting loop (its cuts as region cuts) and one that must end in "("
    "calls": r"""
root  ::= stmt+
stmt  ::= ident ws "=" ws expr ";" ws
expr  ::= ident | ident "(" ( expr ( "," ws expr )* )? ")" | [0-9]+
ident ::= [a-zA-Z_] [a-zA-Z0-9_]*
ws    ::= [ \t\n]*
""",
}
GBNF_TEXTS = {
    "json": [
        '{"a": [1, 2.5, {"b c": "d\\"e"}], "f": true}',
        '[{"x":null},[[-3]],"y\\n z",{}]',
        '{"key with spaces": {"nested": [false, "v", 10.25]}}',
        '{"naïve €": ["中文 \\u00e9\\"q", "𝄞x"]}',  # the loop set's UTF-8 and escape states
    ],
    "arithmetic": ["(1 + 23) * -4 / (5-(6*7))", "((((8))))+9 * 10", "-(-(-1))/22+333"],
    "calls": [
        "foo = bar(baz, qux_1);\nx_1 = 42; abc=d(e(f), 7);",
        "total_sum = add(total_sum, item);\n  item=next_item(it);",
    ],
}


@needs_c
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("name", sorted(GBNF))
def test_gbnf_masks_equal_the_numpy_walk(monkeypatch, name: str, sparse: bool) -> None:
    """`sparse`: the walks' few-word masks kept as SparseWords, as the C walker does from 64k
    tokens up (this vocabulary is far smaller)."""
    from grammar.ebnf.compiler import CompiledEBNF, compile_rules
    from grammar.ebnf.syntax import parse_gbnf

    monkeypatch.setattr(native_walk, "_SPARSE_FROM", 0 if sparse else 1 << 40)
    text = GBNF[name]
    vocab = _vocab(GBNF_TEXTS[name], n=800)
    slow, fast = _compile_both(
        monkeypatch, lambda: compile_rules(parse_gbnf(text), vocab, "root", text)
    )
    assert isinstance(fast, CompiledEBNF)
    assert slow._walker is None and fast._walker is not None
    token_lists = [_tokenize(vocab, t, longest=2) for t in GBNF_TEXTS[name]]
    assert _same_masks_along(slow, fast, token_lists) > 25
    kept = [d.words for d in fast._top.values() if d.words is not None]
    assert any(isinstance(w, native_walk.SparseWords) for w in kept) == sparse


def test_the_switch_keeps_the_numpy_walk(monkeypatch) -> None:
    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "0")
    vocab = TokenVocabulary([bytes([b]) for b in range(256)], [])
    assert native_walk.walker_for(vocab) is None
    assert CompiledCFG(grammar_text("arithmetic"), vocab)._walker is None


def test_the_c_source_compiles_without_warnings() -> None:
    from grammar import native_build

    if native_build.compiler() is None:
        pytest.skip("no C compiler")
    assert native_build.compile_warnings(native_walk.UNITS) == {}


def _stays(table: np.ndarray, index: np.ndarray, data: bytes, s: int) -> bool:
    """Every byte of `data` read from state s leads to a state of the set (index >= 0)."""
    for b in data:
        s = int(table[s, b])
        if index[s] < 0:
            return False
    return True


@needs_c
def test_loop_set_tables_match_a_direct_walk(monkeypatch) -> None:
    """`CutWalker.loop` of a JSON string state's loop set (UTF-8 and escape states included):
    the tokens whose bytes all stay in the set from the string state, and each trie node's
    `clean` bits, against the terminal's table walked token by token in Python."""
    from grammar.ebnf.compiler import compile_rules
    from grammar.ebnf.lower import Terminal
    from grammar.ebnf.syntax import parse_gbnf

    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "1")  # (the C walk, whatever the run's switch)
    text = GBNF["json"]
    vocab = _vocab(GBNF_TEXTS["json"], n=300)
    walker = native_walk.walker_for(vocab)
    g = compile_rules(parse_gbnf(text), vocab, "root", text)
    found = 0
    for term in g.network.terminals:
        if not isinstance(term, Terminal):
            continue
        for q in range(1, term.table.shape[0]):
            if term.accepting[q] or np.count_nonzero(term.table[q, :128] == q) < 64:
                continue
            sub, index = native_walk.loop_set(term.table, term.accepting, term.live, q)
            assert index[q] == 0 and sub.shape[0] > 2  # q, its UTF-8 and escape states
            in_s = np.flatnonzero(index >= 0)
            assert not term.accepting[in_s].any() and term.live[in_s].all()
            words, clean = walker.loop(sub)
            found += 1

            bits = np.unpackbits(words.view(np.uint8), bitorder="little")
            for i in range(len(vocab)):
                data = vocab.token_bytes(i)
                assert bits[i] == bool(data and _stays(term.table, index, data, q)), data
            # clean bit k of a node: its byte and every path below it (every token ending in
            # its subtree, from that byte on) stay in S from S's state k
            nodes = walker.trie.nodes
            text_of = [b""] * nodes.shape[0]
            for i in range(1, nodes.shape[0]):
                parent = i - 1
                while nodes[parent]["end"] <= i:  # preorder: the parent is the nearest above
                    parent -= 1
                text_of[i] = text_of[parent] + bytes([int(nodes[i]["byte"])])
            state_of = np.argsort(np.where(index >= 0, index, 127))[: sub.shape[0]]
            for i in range(1, nodes.shape[0]):
                depth, end = int(nodes[i]["depth"]), int(nodes[i]["end"])
                below = [text_of[j][depth - 1 :] for j in range(i, end)]
                for k, s in enumerate(state_of.tolist()):
                    want = all(_stays(term.table, index, t, s) for t in below)
                    assert bool(clean[i] >> k & 1) == want, (text_of[i], k)
    assert found


@needs_c
def test_a_shipped_gbnf_grammar_rebuilds_its_loop_sets(monkeypatch) -> None:
    """The compile worker pickles a recursive GBNF grammar whole: the loaded copy must not keep
    the sender's loop-set addresses (or its id()-keyed caches), and its masks match a fresh
    compile along the sentences (strings, UTF-8, identifiers: loop sets and region cuts)."""
    from grammar.ebnf.compiler import compile_rules
    from grammar.ebnf.syntax import parse_gbnf
    from runtime.scheduling import compile_worker

    monkeypatch.setenv("SGL_GRAMMAR_NATIVE", "1")  # (the C walk, whatever the run's switch)
    text = GBNF["json"]
    vocab = _vocab(GBNF_TEXTS["json"], n=300)
    sent = compile_rules(parse_gbnf(text), vocab, "root", text)
    token_lists = [_tokenize(vocab, t, longest=3) for t in GBNF_TEXTS["json"]]
    _same_masks_along(sent, sent, token_lists)  # (the sender's caches filled first)
    assert sent._loop_sets
    got = compile_worker.loads_whole(compile_worker.dumps_whole(sent, vocab), vocab)
    assert got._loop_sets and got._walker is sent._walker
    for walk, _term in got._loop_sets.values():
        assert walk.clean_ptr == walk.clean.ctypes.data
        assert walk.index_ptr == walk.index.ctypes.data
    assert set(got._term_sets) <= {id(t) for t in got.network.terminals}
    fresh = compile_rules(parse_gbnf(text), vocab, "root", text)
    assert _same_masks_along(fresh, got, token_lists) > 25


def test_first_bytes_words_are_the_tokens_of_those_first_bytes():
    """The mask of the tokens whose first byte is in a set (lark: the tokens whose first byte
    already ends the terminal), for small sets (their bytes' masks ORed) and large ones (the
    other bytes' complemented): against each token's own first byte; EOS and the empty token
    never in it."""
    from grammar.cfg.mask import VocabLayout

    vocab = _vocab(["select a, b from t where a = 1;", "ü ≠ 中"], n=300)
    layout = VocabLayout(vocab)
    rng = np.random.default_rng(0)
    for k in (0, 1, 5, 128, 129, 200, 256):
        byte_set = np.zeros(256, dtype=bool)
        byte_set[rng.choice(256, k, replace=False)] = True
        words = layout.first_bytes_words(byte_set)
        got = np.unpackbits(words.view(np.uint8), bitorder="little")[: len(vocab)].astype(bool)
        want = [bool(b) and bool(byte_set[b[0]]) for b in map(vocab.token_bytes, range(len(vocab)))]
        assert got.tolist() == want, k
        assert not np.unpackbits(words.view(np.uint8), bitorder="little")[len(vocab) :].any()
