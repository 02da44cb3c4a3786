"""Context-free constraints from lark grammars: `compile_lark(text, vocab, start="start")`.

lark parses the grammar and builds its LALR(1) table; every terminal becomes a byte DFA through
the regex machinery (`grammar.cfg.terminals`); the matcher runs its own LR parser over lark's
table (`grammar.cfg.parser`) and a contextual lexer (`grammar.cfg.lexer`); token masks come from
cached vocabulary decompositions (`grammar.cfg.mask`).

Lexing semantics. As in lark's contextual lexer, the terminals tried at a point are the LALR
lookaheads of the parser state plus the %ignore terminals. A token of text ends where the next
byte can continue none of them (maximal munch, no backtracking); its terminal is the best of the
candidates that accept the whole text, in lark's order: higher priority, then a string literal
before a regex (lark's keyword-vs-name rule), then longer max width, then name. Ignored
terminals are dropped; the others go to the parser, which must accept them. Where lark's Python
`re` alternation would stop earlier than the longest match (a terminal `a|ab`, or a regex whose
match is a strict prefix of a literal of equal priority), we take the longest; such grammars are
rare, and every sentence we accept is checked against lark in the tests.

Masks. A matcher state is (parser stack, lexer state). Its mask is computed once per distinct
pair and cached on the interned stack node, so sequences that reach the same configuration share
it; the parser-independent work (walking the vocabulary) is done once per (lexer, lexer state),
at compile time for every lexer state and the cut groups that follow (up to `MAX_EAGER_WALKS`,
`MAX_EAGER_SECONDS`, `MAX_EAGER_BYTES`; beyond them lazily, on first visit).
EOS is allowed exactly where the text so far is a sentence.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from grammar.cfg import native_walk
from grammar.cfg.lexer import DEAD, START, ContextLexer
from grammar.cfg.mask import (
    Decomposition,
    VocabLayout,
    decompose,
    native_decompose,
    top_decomposition,
)
from grammar.cfg.matcher import CFGMatcher
from grammar.cfg.parser import LRTable, StackNode
from grammar.cfg.terminals import TerminalSpec, build_terminal
from grammar.errors import GrammarError
from grammar.tokens.cache import CompileCache
from grammar.tokens.vocab import TokenVocabulary

logger = logging.getLogger(__name__)

_CFG_CACHE: CompileCache = CompileCache(max_entries=128)
_LAYOUTS: CompileCache = CompileCache(max_entries=8)
MAX_FORCED_BYTES = 1024
ROOT_TASK = np.array([native_walk.ROOT], dtype=np.int32)  # every token, for the C walk
# vocabulary walks (decompositions) done at compile time; beyond either cap the rest stay lazy
MAX_EAGER_WALKS = 8192
MAX_EAGER_SECONDS = 5.0
MAX_EAGER_BYTES = 64 << 20  # masks and row lists those walks keep (a grammar's cache footprint)


def _lark_analysis(text: str, start: str) -> tuple[list, list, list, Any]:
    """lark's grammar loader and LALR(1) analysis, without building lark's own lexers (we never
    use them): (terminal defs, rules, ignored terminal names, parse table). Every lark error
    becomes a GrammarError carrying lark's message (which names the rule or terminal)."""
    from lark.common import ParserConf
    from lark.exceptions import LarkError
    from lark.load_grammar import load_grammar
    from lark.parsers.lalr_analysis import LALR_Analyzer

    try:
        grammar, _ = load_grammar(text, "<grammar>", None, False)
        terminals, rules, ignore = grammar.compile([start], set())
        analysis = LALR_Analyzer(ParserConf(rules, {}, [start]))
        analysis.compute_lalr()
    except LarkError as e:
        raise GrammarError(f"lark grammar error: {e}") from None
    except (KeyError, ValueError, AssertionError, TypeError) as e:
        raise GrammarError(f"lark grammar error: {type(e).__name__}: {e}") from None
    return terminals, rules, ignore, analysis.parse_table


def vocab_layout(vocab: TokenVocabulary) -> VocabLayout:
    """The vocabulary's layout for lexing, shared by every grammar compiled over it."""
    return _LAYOUTS.get_or_build(vocab.hash, lambda: VocabLayout(vocab))


class CompiledCFG:
    """A compiled lark grammar over one vocabulary. Shared between threads (caches fill lazily);
    each sequence gets its own `matcher()`."""

    def __init__(self, text: str, vocab: TokenVocabulary, start: str = "start") -> None:
        self.source = text
        self.start = start
        self.vocab = vocab
        self.eos_token_ids = frozenset(vocab.eos_token_ids)
        terminal_defs, _, ignore, table = _lark_analysis(text, start)
        self.terminals: list[TerminalSpec] = [
            build_terminal(t.name, t.pattern, t.priority) for t in terminal_defs
        ]
        index = {t.name: i for i, t in enumerate(self.terminals)}
        self.ignore_bits = sum(1 << index[n] for n in set(ignore) if n in index)
        self.table = LRTable(table, start, index)
        self.layout: VocabLayout = vocab_layout(vocab)
        # the C trie walk for first visits (None: the numpy walks), chosen once per grammar
        self._walker = native_walk.walker_for(vocab)
        self.num_words = self.layout.num_words
        self._lexers: dict[int, ContextLexer] = {}  # terminal bitset -> lexer
        self._state_lexer: dict[int, ContextLexer] = {}  # LR state -> lexer
        # keyed by lexer-state signature (see ContextLexer.signature)
        self._top: dict[tuple, Decomposition] = {}
        self._first_cut: dict[bytes, np.ndarray] = {}  # keyed by the dead-byte set
        # masks by (lexer state, top stack states read); _mask_len: how many to read
        self._mask_cache: dict[tuple, np.ndarray] = {}
        self._mask_len: dict[tuple[int, int], int] = {}
        self._child_cache: dict[tuple, np.ndarray | None] = {}  # see _evaluate_child
        self._lock = threading.Lock()
        # build every context's lexer now: a bad terminal combination fails at compile time
        for state in self.table.actions:
            self.lexer(state)
        self.eager_walks = self._precompute(MAX_EAGER_WALKS, MAX_EAGER_SECONDS, MAX_EAGER_BYTES)

    def _precompute(self, budget: int, seconds: float, max_bytes: int) -> int:
        """Walk the vocabulary now for every lexer state (a first visit during decoding would
        cost a full walk, 5-40 ms with a large vocabulary; compile runs off the decode loop), then
        for the cut groups those walks produce, breadth first, in the lexers that can follow the
        cut terminal; at most `budget` walks, about `seconds` and about `max_bytes` kept, the
        rest stay lazy. Only fills caches: the masks are the same either way. Returns the number
        of walks done."""
        deadline = time.perf_counter() + seconds
        used = 0

        def spent() -> bool:
            return done >= budget or used > max_bytes or time.perf_counter() > deadline

        holders: dict[tuple, list[ContextLexer]] = {}  # signature -> lexers with such a state
        starts: list[tuple[ContextLexer, int]] = []
        inner: list[tuple[ContextLexer, int]] = []
        for lx in self._lexers.values():
            for q in range(START, lx.num_states):
                key = lx.signature[q]
                if key not in holders:
                    holders[key] = []
                    (starts if q == START else inner).append((lx, q))
                holders[key].append(lx)
        # the lexers after a shift of terminal t: those of its shift targets
        after: dict[int, dict[int, ContextLexer]] = {}
        for row in self.table.actions.values():
            for t, (is_shift, arg) in row.items():
                if is_shift and t != self.table.end:
                    lx = self.lexer(arg)
                    after.setdefault(t, {})[id(lx)] = lx
        done = 0
        pending: deque[tuple[Decomposition, list[ContextLexer]]] = deque()
        for lx, q in starts + inner:
            if spent():
                return done
            d = self._top_decomposition(lx, q)
            pending.append((d, holders[lx.signature[q]]))
            done, used = done + 1, used + _footprint(d)
        while pending:
            d, lexers = pending.popleft()
            for g, (t, rows, pos) in enumerate(d.cuts):
                nexts = lexers if self.ignore_bits >> t & 1 else list(after.get(t, {}).values())
                for lx2 in nexts:
                    if (g, id(lx2)) in d.children:
                        continue
                    if spent():
                        return done
                    child = self._child(lx2, rows, pos)
                    d.children[(g, id(lx2))] = child
                    pending.append((child, [lx2]))
                    done, used = done + 1, used + _footprint(child)
        return done

    # ----- lexers and parser -----
    def lexer(self, state: int) -> ContextLexer:
        lx = self._state_lexer.get(state)
        if lx is None:
            bits = self.table.lookahead_bits[state] | self.ignore_bits
            lx = self._lexers.get(bits)
            if lx is None:
                lx = self._lexers.setdefault(bits, ContextLexer(self.terminals, bits))
            self._state_lexer[state] = lx
        return lx

    def take(self, node: StackNode, terminal: int) -> StackNode | None:
        """The stack after a lexed terminal (unchanged for an ignored one), None if refused."""
        if self.ignore_bits >> terminal & 1:
            return node
        return self.table.feed(node, terminal)

    def live_bits(self, node: StackNode) -> int:
        return self.table.acceptable_bits(node) | self.ignore_bits

    def step(self, node: StackNode, q: int, byte: int) -> tuple[StackNode, int] | None:
        """(stack, lexer state) after one byte, or None if the byte is refused."""
        lx = self.lexer(node.state)
        nq = lx.rows[q][byte]
        if nq != DEAD:
            return node, nq
        w = lx.winner[q]
        if w < 0:
            return None
        node2 = self.take(node, w)
        if node2 is None:
            return None
        nq = self.lexer(node2.state).rows[START][byte]
        return None if nq == DEAD else (node2, nq)

    def walk(self, node: StackNode, q: int, data: bytes) -> tuple[StackNode, int] | None:
        """(stack, lexer state) after `data`, or None if any byte is refused or the text cannot
        continue into a terminal the stack accepts."""
        for b in data:
            nxt = self.step(node, q, b)
            if nxt is None:
                return None
            node, q = nxt
        if q != START and not self.lexer(node.state).alive[q] & self.live_bits(node):
            return None
        return node, q

    def is_accepting(self, node: StackNode, q: int) -> bool:
        if q != START:
            w = self.lexer(node.state).winner[q]
            if w < 0:
                return False
            node = self.take(node, w)  # type: ignore[assignment]
            if node is None:
                return False
        return self.table.accepts_end(node)

    # ----- masks -----
    def bitmask(self, node: StackNode, q: int) -> np.ndarray:
        """Packed mask (int32 words) of the tokens allowed at (node, q), EOS included where the
        text is a sentence; shared, read-only. Cached on the node."""
        if node.masks is None:
            node.masks = {}
        words = node.masks.get(("eos", q))
        if words is None:
            words = self.base_mask(node, q)
            if self.layout.eos.size and self.is_accepting(node, q):
                words = words.copy()
                eos = self.layout.eos
                bits = (1 << (eos & 31)).astype(np.uint32).view(np.int32)
                np.bitwise_or.at(words, eos >> 5, bits)
            node.masks[("eos", q)] = words
        return words

    def base_mask(self, node: StackNode, q: int) -> np.ndarray:
        """The token mask at (node, q) without EOS. Cached on the node, and by the top stack
        states the computation read (a mask computed inside nested brackets serves every
        nesting depth whose top states agree)."""
        table = self.table
        if node.masks is None:
            node.masks = {}
        words = node.masks.get(q)
        if words is not None:
            table.note(node.low[("mask", q)])  # type: ignore[index]
            return words
        length = self._mask_len.get((node.state, q))
        if length is not None:
            words = self._mask_cache.get((q, table._top_states(node, length)))
            if words is not None:
                low = max(node.depth - length + 1, 0)
                node.masks[q] = words
                table._remember(node, ("mask", q), low)
                table.note(low)
                return words
        outer = table.begin_read(node.depth)
        words = self._compute_mask(node, q)
        low = table.end_read(outer)
        length = max(node.depth - low + 1, length or 0)
        self._mask_len[(node.state, q)] = length
        self._mask_cache[(q, table._top_states(node, length))] = words
        node.masks[q] = words
        table._remember(node, ("mask", q), low)
        return words

    def _compute_mask(self, node: StackNode, q: int) -> np.ndarray:
        lx = self.lexer(node.state)
        parts = self._evaluate(self._top_decomposition(lx, q), node)
        w = lx.winner[q]
        if w >= 0:
            # tokens whose first byte already ends the terminal: the next stack's whole mask
            node2 = self.take(node, w)
            if node2 is not None:
                parts.append(self.base_mask(node2, START) & self._first_cut_words(lx, q))
        out = parts[0].copy() if parts else self.layout.empty.copy()
        for p in parts[1:]:
            np.bitwise_or(out, p, out=out)
        return out

    def _evaluate(self, d: Decomposition, node: StackNode) -> list[np.ndarray]:
        """Packed masks (to OR) of the tokens of `d` that are valid at `node`."""
        ignore, table = self.ignore_bits, self.table
        parts = [
            words for alive, words in d.within if alive & ignore or table.accepts_any(node, alive)
        ]
        for g, (terminal, rows, pos) in enumerate(d.cuts):
            node2 = self.take(node, terminal)
            if node2 is None:
                continue
            lx2 = self.lexer(node2.state)
            child = d.children.get((g, id(lx2)))
            if child is None:
                child = self._child(lx2, rows, pos)
                d.children[(g, id(lx2))] = child
            words = self._evaluate_child(child, node2)
            if words is not None:
                parts.append(words)
        return parts

    def _evaluate_child(self, d: Decomposition, node: StackNode) -> np.ndarray | None:
        """`_evaluate` ORed into one mask, cached by the top stack states it read (so deeper
        copies of the same situation, e.g. more nested brackets, reuse it)."""
        table = self.table
        length = d.children_len.get(node.state)
        if length is not None:
            key = (id(d), table._top_states(node, length))
            if key in self._child_cache:
                table.note(max(node.depth - length + 1, 0))
                return self._child_cache[key]
        outer = table.begin_read(node.depth)
        parts = self._evaluate(d, node)
        low = table.end_read(outer)
        words = None
        if parts:
            words = parts[0].copy() if len(parts) > 1 else parts[0]
            for p in parts[1:]:
                np.bitwise_or(words, p, out=words)
        length = max(node.depth - low + 1, length or 0)
        d.children_len[node.state] = length
        self._child_cache[(id(d), table._top_states(node, length))] = words
        return words

    def _top_decomposition(self, lx: ContextLexer, q: int) -> Decomposition:
        key = lx.signature[q]
        d = self._top.get(key)
        if d is None:
            if self._walker is None:
                d = top_decomposition(self.layout, lx, q)
            else:
                d = native_decompose(self._walker, lx, self._walker.tasks(ROOT_TASK, q))
            d = self._top.setdefault(key, d)
        return d

    def _child(self, lx: ContextLexer, rows: np.ndarray, pos: np.ndarray | None) -> Decomposition:
        """The rest of a cut group's tokens read from `lx`'s start: (token rows, byte offsets)
        by the numpy walk, or trie nodes (`pos` None) by the C one."""
        if pos is None:
            return native_decompose(self._walker, lx, self._walker.tasks(rows, START))  # type: ignore[union-attr]
        return decompose(self.layout, lx, START, rows, pos)

    def _first_cut_words(self, lx: ContextLexer, q: int) -> np.ndarray:
        key = lx.signature[q]
        words = self._first_cut.get(key)
        if words is None:
            words = self._first_cut.setdefault(key, self.layout.first_bytes_words(lx.dead_bytes[q]))
        return words

    # ----- forced text -----
    def allowed_bytes(self, node: StackNode, q: int) -> list[int]:
        out = []
        for b in range(256):
            nxt = self.step(node, q, b)
            if nxt is not None:
                n2, q2 = nxt
                if self.lexer(n2.state).alive[q2] & self.live_bits(n2):
                    out.append(b)
        return out

    def forced(self, node: StackNode, q: int) -> bytes:
        """The longest byte string every valid continuation of (node, q) starts with."""
        if node.forced is None:
            node.forced = {}
        hit = node.forced.get(q)
        if hit is not None:
            return hit
        out = bytearray()
        n, s = node, q
        while len(out) < MAX_FORCED_BYTES and not self.is_accepting(n, s):
            only = self.allowed_bytes(n, s)
            if len(only) != 1:
                break
            out.append(only[0])
            n, s = self.step(n, s, only[0])  # type: ignore[misc]
        result = bytes(out)
        node.forced[q] = result
        return result

    def matcher(self) -> CFGMatcher:
        return CFGMatcher(self, self.table.root, START)


def _footprint(d: Decomposition) -> int:
    """Bytes a decomposition keeps (its masks and cut lists)."""
    cuts = sum(r.nbytes + (0 if p is None else p.nbytes) for _, r, p in d.cuts)
    return sum(w.nbytes for _, w in d.within) + cuts


def compile_lark(grammar_text: str, vocab: TokenVocabulary, start: str = "start") -> CompiledCFG:
    """A constraint from a lark grammar (LALR(1)); cached by (text, start, vocab.hash).

    Raises GrammarError for a grammar lark rejects (undefined rule or terminal, LALR conflict)
    or a terminal whose regex cannot become a DFA, naming it."""
    return _CFG_CACHE.get_or_build(
        ("lark", grammar_text, start, vocab.hash),
        lambda: CompiledCFG(grammar_text, vocab, start),
    )


def clear_cfg_caches() -> None:
    _CFG_CACHE.clear()
