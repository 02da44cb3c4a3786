"""The compile entry points: regex / JSON Schema / choices -> cached CompiledGrammar."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from grammar.automata.fsm import DEFAULT_MAX_STATES, ByteDFA, no_gc, node_to_lazy_dfa
from grammar.automata.lazy_dfa import LazyDFA
from grammar.automata.regex_ast import regex_escape
from grammar.cfg.compiler import compile_lark as compile_lalr_lark
from grammar.ebnf.lark_lower import compile_llguidance_lark, uses_llguidance_syntax
from grammar.errors import EmptyLanguageError
from grammar.json_schema.schema import ANY_DEPTH, json_schema_to_node, load_schema
from grammar.json_schema.strict import apply_mode
from grammar.tokens.cache import CompileCache
from grammar.tokens.compiled import CompiledGrammar
from grammar.tokens.vocab import TokenVocabulary

logger = logging.getLogger(__name__)

# bounded by count and by automaton bytes (a near-budget automaton holds 100+ MB; a lazy one
# grows as walks build rows: sizes are measured again at each insertion)
_CACHE_BYTES = 1 << 30


def _dfa_bytes(dfa: ByteDFA | LazyDFA) -> int:
    return dfa.nbytes


_DFA_CACHE: CompileCache = CompileCache(512, _CACHE_BYTES, _dfa_bytes)
_GRAMMAR_CACHE: CompileCache = CompileCache(256, _CACHE_BYTES, lambda g: _dfa_bytes(g.dfa))


def _dfa(pattern: str, max_states: int):
    return _DFA_CACHE.get_or_build(
        ("dfa", pattern, max_states), lambda: node_to_lazy_dfa(pattern, max_states)
    )


def empty_language_dfa() -> ByteDFA:
    """The DFA that accepts nothing: its start is not accepting and every byte leads to DEAD
    (the automaton of a schema that admits no instance)."""
    return ByteDFA(
        table=np.zeros((2, 1), dtype=np.int32),
        byte_to_class=np.zeros(256, dtype=np.int32),
        accepting=np.zeros(2, dtype=bool),
    )


def compile_regex(
    pattern: str, vocab: TokenVocabulary, *, max_states: int = DEFAULT_MAX_STATES
) -> CompiledGrammar:
    """A constraint from a regex (full match). Cached by (pattern, vocab.hash); thread-safe."""

    def build() -> CompiledGrammar:
        return CompiledGrammar(_dfa(pattern, max_states), vocab, pattern)

    return _GRAMMAR_CACHE.get_or_build(("regex", pattern, vocab.hash, max_states), build)


def compile_json_schema(
    schema: Any,
    vocab: TokenVocabulary,
    *,
    whitespace: str | None = None,
    max_recursion_depth: int = 3,
    any_depth: int = ANY_DEPTH,
    max_states: int = DEFAULT_MAX_STATES,
    json_schema_mode: str = "exact",
) -> CompiledGrammar:
    """A constraint from a JSON Schema (dict, JSON text, pydantic class); see json_schema.py.

    `json_schema_mode` "exact" (the default) generates the schema's own language; "strict"
    generates only the properties each object declares (`grammar.json_schema.strict`).
    A schema that admits no instance compiles to a constraint that refuses every token
    (`admits_nothing` is true on it): callers that serve requests refuse those."""
    loaded = apply_mode(load_schema(schema), json_schema_mode)
    key = (
        "schema",
        json.dumps(loaded, ensure_ascii=False),
        whitespace,
        max_recursion_depth,
        any_depth,
        json_schema_mode,
        vocab.hash,
        max_states,
    )

    def build() -> CompiledGrammar:
        def build_dfa() -> ByteDFA | LazyDFA:
            with no_gc():  # the schema's regex tree too: many small containers, no cycles
                try:
                    node = json_schema_to_node(loaded, whitespace, max_recursion_depth, any_depth)
                except EmptyLanguageError:
                    return empty_language_dfa()
                dfa = node_to_lazy_dfa(node, max_states)
                # freed while the GC is off, unless the NFA keeps it for the members it builds
                # on first read: the GC's first pass after scans only what is kept
                del node
            return dfa

        dfa = _DFA_CACHE.get_or_build(("dfa", *key[:6], max_states), build_dfa)
        return CompiledGrammar(dfa, vocab, key[1])

    return _GRAMMAR_CACHE.get_or_build(key, build)


def compile_lark(grammar_text: str, vocab: TokenVocabulary, start: str = "start") -> Any:
    """A constraint from a lark grammar. Plain lark compiles through `grammar.cfg` (LALR(1),
    a contextual lexer: lark's own meaning); a grammar in llguidance's dialect (`%json`,
    `%regex`, `%llguidance`, special tokens, `&` / `~`, `{M,N}`, rule attributes, `//`
    comments, `-` in names) through `grammar.ebnf.lark_lower` (Earley, so it need not be
    LALR(1)). Both give the matcher interface of every compiled constraint; GrammarError names
    what is refused and where."""
    if uses_llguidance_syntax(grammar_text):
        return compile_llguidance_lark(grammar_text, vocab, start)
    return compile_lalr_lark(grammar_text, vocab, start)


def choices_to_regex(choices: Sequence[str]) -> str:
    """The regex that matches exactly one of `choices` (what `compile_choices` compiles)."""
    return "(" + "|".join(regex_escape(c) for c in choices) + ")"


def compile_choices(choices: Sequence[str], vocab: TokenVocabulary) -> CompiledGrammar:
    """A constraint that matches exactly one of the given strings."""
    return compile_regex(choices_to_regex(list(choices)), vocab)


def clear_caches() -> None:
    _DFA_CACHE.clear()
    _GRAMMAR_CACHE.clear()
