"""GBNF / EBNF grammars as token constraints: `compile_rules(parse_gbnf(text), vocab, root,
text)`, which `grammar.compile_ebnf` calls (and caches, through `grammar.compile`).

A grammar whose root reaches no recursive rule is one regular language: it compiles to a regex
tree and from there to the same `CompiledGrammar` a regex gets (lazy DFA, token index,
jump-forward over the compressed DFA). Otherwise it compiles to a `CompiledEBNF`: the rules'
transition network (`grammar.ebnf.lower`) run by an Earley parser (`grammar.ebnf.earley`).

Masks of a `CompiledEBNF`. A token read from an Earley set either stays inside one terminal
being read there (it ends in a live state of that terminal's DFA), or crosses a point where the
terminal may complete (an accepting state with bytes of the token left). For each (terminal,
state) the vocabulary is walked once, vectorised, and kept (`Decomposition`): the packed mask of
the tokens that stay inside, and the (token row, byte offset) pairs where it may complete. The
mask of a set ORs the first part of each of its (terminal, state) pairs; for the second it
completes the terminal in a hypothetical set and walks the remainders from the terminals read
there (decomposed once per remainder group and terminal, cached), recursively. EOS is allowed
exactly where the text so far is a sentence. A token terminal (one token by id,
`grammar.ebnf.token_terminals`) adds its ids whole where the set can take it.
"""

from __future__ import annotations

import threading
import zlib

import numpy as np

from grammar.automata.fsm import DEAD, START, no_gc, node_to_lazy_dfa
from grammar.cfg import native_walk
from grammar.cfg.mask import VocabLayout
from grammar.ebnf.earley import EarleyParser, ESet
from grammar.ebnf.lower import Lowering, Terminal, clear_shared_terminals, commit_lazy_rules
from grammar.ebnf.network import NetworkBuilder
from grammar.ebnf.syntax import Grammar
from grammar.tokens.cache import CompileCache
from grammar.tokens.compiled import CompiledGrammar
from grammar.tokens.matcher import MatcherBase
from grammar.tokens.vocab import TokenVocabulary

MAX_FORCED_BYTES = 1024
_LAYOUTS: CompileCache = CompileCache(max_entries=4)
_NO_ROWS = np.zeros(0, dtype=np.int64)
_ROOT_TASK = np.array([native_walk.ROOT], dtype=np.int32)  # every token, for the C walk


def vocab_layout(vocab: TokenVocabulary) -> VocabLayout:
    return _LAYOUTS.get_or_build(vocab.hash, lambda: VocabLayout(vocab))


class RowBytes:
    """Per vocabulary: which bytes each token row contains (4 x 64 bits per row), and the
    packed masks of the rows made only of a given byte set (cached by the set)."""

    def __init__(self, layout: VocabLayout) -> None:
        prep = layout.prepared
        self.layout = layout
        self.bits = np.zeros((layout.num_rows, 4), dtype=np.uint64)
        for p in range(prep.columns.shape[0]):
            rows = np.flatnonzero(prep.lengths > p)
            if not rows.size:
                break
            b = prep.columns[p][rows].astype(np.uint64)
            np.bitwise_or.at(self.bits, (rows, (b >> 6).astype(np.int64)), np.uint64(1) << (b & 63))
        self._within: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}

    def only(self, byte_set: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bool per row: every byte of the row is in `byte_set` (bool [256]), their packed
        token mask)."""
        key = np.packbits(byte_set).tobytes()
        hit = self._within.get(key)
        if hit is None:
            allowed = np.packbits(byte_set, bitorder="little").view("<u8")
            inside = ((self.bits & ~allowed) == 0).all(axis=1)
            hit = (inside, self.layout.rows_to_words(np.flatnonzero(inside)))
            if len(self._within) > 256:
                self._within.clear()
            self._within[key] = hit
        return hit


_ROW_BYTES: CompileCache = CompileCache(max_entries=4)
_FIRST_ROWS: CompileCache = CompileCache(max_entries=4)


def first_rows(layout: VocabLayout) -> list[np.ndarray]:
    """Per byte, the token rows that start with it (once per vocabulary, not per grammar)."""
    fs = layout.prepared.first_start
    return [np.arange(fs[b], fs[b + 1], dtype=np.int64) for b in range(256)]


_MIN_LOOP_BYTES = 32  # a state that loops on this many ASCII bytes takes the shortcut
_MAX_PREPARED_LOOPS = 8


def _self_loops(term: Terminal) -> np.ndarray:
    """Per state, the ASCII bytes it reads back to itself (0 for the dead state)."""
    counts = np.count_nonzero(
        term.table[:, :128] == np.arange(term.table.shape[0])[:, None], axis=1
    )
    counts[DEAD] = 0
    return counts


def _loops_at(term: Terminal, q: int) -> bool:
    return q != DEAD and np.count_nonzero(term.table[q, :128] == q) >= _MIN_LOOP_BYTES


class Decomposition:
    """Token (suffixes) read from one terminal state: `words` (packed mask, a C walk's
    `native_walk.SparseWords` when it has few words, or None) of those that end inside the
    terminal; `cut_rows` / `cut_pos` where the terminal may complete with
    bytes left (from the C walk, `native_walk`: `cut_rows` holds trie nodes as descendants
    tasks and `cut_pos` is None); `children[terminal]`: the decomposition of those remainders
    from a terminal's start."""

    __slots__ = ("words", "cut_rows", "cut_pos", "children")

    def __init__(self, words: np.ndarray | None, cut_rows: np.ndarray, cut_pos: np.ndarray):
        self.words = words
        self.cut_rows = cut_rows
        self.cut_pos = cut_pos
        self.children: dict[int, Decomposition] = {}


def decompose(
    layout: VocabLayout, term: Terminal, q: int, rows: np.ndarray, pos: np.ndarray
) -> Decomposition:
    """Walk token rows from byte offsets `pos` through `term`'s DFA from state q."""
    prep = layout.prepared
    n_rows = prep.columns.shape[1]
    cols = prep.columns.reshape(-1)  # byte p of row r at p * n_rows + r
    table = term.table.reshape(-1)
    accepting, live = term.accepting, term.live
    rows = rows.astype(np.int64)
    lens = prep.lengths[rows].astype(np.int64)
    cur = np.full(rows.shape[0], q, dtype=np.int64)
    pos = pos.astype(np.int64)
    inside, cut_rows, cut_pos = [], [], []
    while rows.size:
        nxt = table[cur * 256 + cols[pos * n_rows + rows]].astype(np.int64)
        ok = nxt != DEAD
        rows, cur, pos, lens = rows[ok], nxt[ok], pos[ok] + 1, lens[ok]
        ended = pos == lens
        if ended.any():
            inside.append(rows[ended])
            rest = ~ended
            rows, cur, pos, lens = rows[rest], cur[rest], pos[rest], lens[rest]
        acc = accepting[cur]
        if acc.any():
            cut_rows.append(rows[acc])
            cut_pos.append(pos[acc])
        go = live[cur]
        if not go.all():
            rows, cur, pos, lens = rows[go], cur[go], pos[go], lens[go]
    words = layout.rows_to_words(np.concatenate(inside)) if inside else None
    if cut_rows:
        # int32: the cut lists are most of what a decomposition keeps (rows < 2**31)
        rows32 = np.concatenate(cut_rows).astype(np.int32)
        return Decomposition(words, rows32, np.concatenate(cut_pos).astype(np.int32))
    return Decomposition(words, _NO_ROWS, _NO_ROWS)


def _or_parts(out: np.ndarray, parts: list) -> np.ndarray:
    """OR packed masks and SparseWords into `out` (the sparse ones in one call: their word
    indices may repeat between parts)."""
    index, values = [], []
    for p in parts:
        if type(p) is native_walk.SparseWords:
            index.append(p.index)
            values.append(p.values)
        else:
            np.bitwise_or(out, p, out=out)
    if len(index) == 1:
        out[index[0]] |= values[0]
    elif index:
        np.bitwise_or.at(out, np.concatenate(index), np.concatenate(values))
    return out


class CompiledEBNF:
    """A compiled recursive GBNF grammar over one vocabulary. Shared between threads (caches
    fill lazily); each sequence gets its own `matcher()`."""

    admits_nothing = False

    def __init__(self, g: Grammar, low: Lowering, vocab: TokenVocabulary, source: str) -> None:
        self.source = source
        self.vocab = vocab
        self.eos_token_ids = frozenset(vocab.eos_token_ids)
        self.layout = vocab_layout(vocab)
        self.num_words = self.layout.num_words
        self.network = NetworkBuilder(low, vocab, self.num_words).build()
        self.parser = EarleyParser(self.network)
        self._top: dict[tuple[int, int], Decomposition] = {}
        # cut groups by content: decompositions whose cuts are equal share one `children`
        # dict (the walks of the remainders depend only on the cuts), see `_share`
        self._by_cuts: dict[tuple[int, int], list[Decomposition]] = {}
        self._lock = threading.Lock()
        self.start = self.parser.initial()
        self._first_rows = _FIRST_ROWS.get_or_build(vocab.hash, lambda: first_rows(self.layout))
        self._walker = native_walk.walker_for(vocab)  # C first-visit walks (None: numpy)
        self._loop_sets: dict[tuple[int, int], tuple] = {}  # (id(terminal), q) -> LoopWalk
        self._term_sets: dict[int, tuple] = {}  # id(terminal) -> its walks' set and mode
        if self._walker is not None:
            self._prepare_loops()
        # the decompositions of the start set now: the first mask is the slow one
        self.bitmask(self.start)

    def matcher(self) -> EBNFMatcher:
        return EBNFMatcher(self, self.start)

    def __getstate__(self) -> dict:
        # (the compile worker ships a compiled grammar whole) the loop sets hold addresses and
        # both caches are keyed by id(): this process's own, rebuilt where it is loaded
        state = self.__dict__.copy()
        state["_loop_sets"] = {}
        state["_term_sets"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._walker is not None:
            self._prepare_loops()

    def _top_decomposition(self, t: int, q: int) -> Decomposition:
        d = self._top.get((t, q))
        if d is None:
            term = self.network.terminals[t]
            if self._walker is not None:
                d = self._top_native(term, q)
            else:
                d = self._top_numpy(term, q)
            self._share(d)
            with self._lock:
                d = self._top.setdefault((t, q), d)
        return d

    def _top_numpy(self, term: Terminal, q: int) -> Decomposition:
        loops = term.table[q] == q
        looped = None
        first = np.flatnonzero(term.table[q] != DEAD)
        rows = np.concatenate([self._first_rows[b] for b in first]) if first.size else _NO_ROWS
        if not term.accepting[q] and np.count_nonzero(loops[:128]) >= _MIN_LOOP_BYTES:
            # inside a string-like loop: a token made only of looping bytes comes back to q at
            # every byte (within, no cut: q does not accept): one shared mask, and only the
            # other tokens are walked
            row_bytes = _ROW_BYTES.get_or_build(self.vocab.hash, lambda: RowBytes(self.layout))
            inside, looped = row_bytes.only(loops)
            rows = rows[~inside[rows]]
        d = decompose(self.layout, term, q, rows, np.zeros(rows.shape[0], dtype=np.int64))
        if looped is not None:
            d.words = looped if d.words is None else looped | d.words
        return d

    def _top_native(self, term: Terminal, q: int) -> Decomposition:
        """The C walk from state q. In a loop (a string's body, an identifier's tail) the
        tokens that stay in q's loop set from q are one vocabulary-wide mask, and the walk
        skips them (their cuts, where the set accepts, as region cuts); elsewhere the
        terminal's own loop set, if any, still saves the walk inside its subtrees."""
        walker = self._walker
        assert walker is not None
        looped = None
        if _loops_at(term, q):
            in_set = self._loop_set(term, q)
            looped = in_set.words
            mode = native_walk.SKIP_FROM_START
            mode |= native_walk.SET_ACCEPTS if term.accepting[q] else 0
        else:
            in_set, mode = self._term_set(term)
        words, cuts = walker.terminal(
            term.table, term.accepting, term.live, _ROOT_TASK, q, in_set, mode
        )  # fmt: skip
        if looped is not None:
            if words is None:
                words = looped
            elif isinstance(words, native_walk.SparseWords):
                words = words.into(looped.copy())
            else:
                words = looped | words
        return Decomposition(words, cuts, None)

    def _loop_set(self, term: Terminal, q: int) -> native_walk.LoopWalk:
        key = (id(term), q)
        hit = self._loop_sets.get(key)
        if hit is None:
            sub, index = native_walk.loop_set(term.table, term.accepting, term.live, q)
            walk = self._walker.prepare(sub, index)  # type: ignore[union-attr]
            with self._lock:  # (the terminal is held too: its id stays its own)
                hit = self._loop_sets.setdefault(key, (walk, term))
        return hit[0]

    def _term_set(self, term: Terminal) -> tuple[native_walk.LoopWalk | None, int]:
        """The loop set a walk of `term` uses wherever it starts (that of its state looping on
        the most ASCII bytes, if one loops on _MIN_LOOP_BYTES), and the walk's mode."""
        hit = self._term_sets.get(id(term))
        if hit is None:
            counts = _self_loops(term)
            q = int(np.argmax(counts))
            hit = (None, 0)
            if counts[q] >= _MIN_LOOP_BYTES:
                mode = native_walk.SET_ACCEPTS if term.accepting[q] else 0
                hit = (self._loop_set(term, q), mode)
            with self._lock:  # (the terminals live as long as the grammar: ids stay theirs)
                hit = self._term_sets.setdefault(id(term), hit)
        return hit

    def _prepare_loops(self) -> None:
        """While compiling, not in a first mask: each terminal's table as C reads it and its
        walks' loop set (`_term_set`), and the loop sets' vocabulary tables (`CutWalker.loop`,
        ~1-2 ms a set at 129k tokens, cached per vocabulary) of every looping state
        (`_loops_at`), at most _MAX_PREPARED_LOOPS sets a grammar."""
        walker = self._walker
        assert walker is not None
        sets = 0
        for term in self.network.terminals:
            if not isinstance(term, Terminal):
                continue
            walker.prepare_terminal(term.table, term.accepting, term.live)
            self._term_set(term)
            for q in np.flatnonzero(_self_loops(term) >= _MIN_LOOP_BYTES).tolist():
                if sets < _MAX_PREPARED_LOOPS:
                    self._loop_set(term, q)
                    sets += 1

    def _share(self, d: Decomposition) -> None:
        """Give `d` the `children` of an earlier decomposition with the same cuts, if any: the
        same remainders reached through another terminal or state (an identifier's cuts after
        `int` and after `x`) are then walked once per grammar, not once per path."""
        if not d.cut_rows.size:
            return
        key = (d.cut_rows.size, zlib.crc32(d.cut_rows))
        if d.cut_pos is not None:
            key = (key[0], zlib.crc32(d.cut_pos, key[1]))
        with self._lock:
            same = self._by_cuts.setdefault(key, [])
            for other in same:
                if np.array_equal(other.cut_rows, d.cut_rows) and (
                    d.cut_pos is None or np.array_equal(other.cut_pos, d.cut_pos)
                ):
                    d.children = other.children
                    return
            same.append(d)

    def _child(self, term: Terminal, d: Decomposition) -> Decomposition:
        """The rest of `d`'s cut tokens read from `term`'s start."""
        if d.cut_pos is None:  # trie nodes: the C walk
            in_set, mode = self._term_set(term)
            words, cuts = self._walker.terminal(  # type: ignore[union-attr]
                term.table, term.accepting, term.live, d.cut_rows, START, in_set, mode
            )
            child = Decomposition(words, cuts, None)
        else:
            child = decompose(self.layout, term, START, d.cut_rows, d.cut_pos)
        self._share(child)
        return child

    def bitmask(self, e: ESet) -> np.ndarray:
        """Packed mask (int32 words) of the tokens allowed at `e`; cached on the set."""
        if e.words is not None:
            return e.words
        parts: list[np.ndarray] = []
        token_terms = self.parser.token_terms
        terminals = self.network.terminals
        for key in e.scan:
            if key[0] in token_terms:  # one whole token by id (only at a token's start)
                parts.append(terminals[key[0]].words)
                continue
            d = self._top_decomposition(*key)
            if d.words is not None:
                parts.append(d.words)
            if d.cut_rows.size:
                self._remainders(d, self.parser.complete(e, key), parts)
        out = _or_parts(self.layout.empty.copy(), parts)
        if e.accept and self.layout.eos.size:
            eos = self.layout.eos
            np.bitwise_or.at(out, eos >> 5, (1 << (eos & 31)).astype(np.uint32).view(np.int32))
        e.words = out
        return out

    def _remainders(self, d: Decomposition, e: ESet, parts: list[np.ndarray]) -> None:
        """The masks of the tokens of `d`'s cut groups that go on from hypothetical set e."""
        terminals = self.network.terminals
        token_terms = self.parser.token_terms
        for key in e.scan:
            t = key[0]
            if t in token_terms:  # a token terminal starts at a token's start, not inside one
                continue
            child = d.children.get(t)
            if child is None:
                child = self._child(terminals[t], d)
                with self._lock:
                    child = d.children.setdefault(t, child)
            if child.words is not None:
                parts.append(child.words)
            if child.cut_rows.size:
                self._remainders(child, self.parser.complete(e, key), parts)

    def forced(self, e: ESet) -> bytes:
        return self.parser.forced(e, MAX_FORCED_BYTES)


class EBNFMatcher(MatcherBase):
    """One sequence's position in a recursive GBNF grammar (a `grammar.Matcher`: `MatcherBase`
    over an Earley set), plus `rollback(n)` (undo the last n `advance` / `advance_bytes`
    calls). Cheap to copy; not thread-safe (one sequence, one thread)."""

    __slots__ = ("_set", "_history")
    _whole = "sentence"
    _by_id = True  # token terminals (where the grammar has any)

    def __init__(self, grammar: CompiledEBNF, e: ESet, ended: bool = False) -> None:
        self.grammar = grammar
        self._set = e
        self._ended = ended
        self._history: list[tuple[ESet, bool]] = []

    def copy(self) -> EBNFMatcher:
        m = EBNFMatcher(self.grammar, self._set, self._ended)
        m._history = list(self._history)
        return m

    def _take_token(self, token_id: int) -> bool:
        g = self.grammar
        if not g.parser.token_terms or not 0 <= token_id < len(g.vocab):
            return False
        # a token the grammar names by id (an EOS id too, where it names it)
        nxt = g.parser.advance_token(self._set, token_id, g.vocab.token_bytes(token_id))
        if nxt is None:
            return False
        self._record()
        self._set = nxt
        return True

    def _record(self) -> None:
        self._history.append((self._set, self._ended))

    def _step(self, data: bytes) -> bool:
        nxt = self.grammar.parser.walk(self._set, data)
        if nxt is None:
            return False
        self._history.append((self._set, self._ended))
        self._set = nxt
        return True

    def _live_bitmask(self) -> np.ndarray:
        return self.grammar.bitmask(self._set)

    def _empty_bitmask(self) -> np.ndarray:
        return self.grammar.layout.empty

    def _forced(self) -> bytes:
        return self.grammar.forced(self._set)

    def _cannot_grow(self) -> bool:
        return self._set.accept and not self._set.scan

    def rollback(self, n: int = 1) -> None:
        """Undo the last n advances (ValueError if there were fewer)."""
        if n < 0 or n > len(self._history):
            raise ValueError(f"cannot roll back {n} steps ({len(self._history)} recorded)")
        if n:
            self._set, self._ended = self._history[-n]
            del self._history[-n:]

    def is_accepting(self) -> bool:
        """The text so far is a sentence of the grammar."""
        return self._set.accept


def compile_rules(
    g: Grammar, vocab: TokenVocabulary, root: str, source: str
) -> CompiledGrammar | CompiledEBNF:
    """Compile parsed rules: one regex when the root is regular, else the Earley form."""
    if g.lazy:
        g = commit_lazy_rules(g, source)
    low = Lowering(g, root)
    node = low.root_node()
    if node is not None:
        with no_gc():
            dfa = node_to_lazy_dfa(node)
        return CompiledGrammar(dfa, vocab, source)
    return CompiledEBNF(g, low, vocab, source)


def clear_ebnf_caches() -> None:
    """Drop the terminal automata GBNF grammars share (compiled grammars are cached by
    `grammar.compile`)."""
    clear_shared_terminals()
