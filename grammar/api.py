"""The compile entry point: `compile(Constraint, vocab)`, with the one cache of compiled
constraints; the `compile_*` functions are thin wrappers that build the `Constraint`."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from grammar.automata.fsm import DEFAULT_MAX_STATES, ByteDFA, no_gc, node_to_lazy_dfa
from grammar.automata.lazy_dfa import LazyDFA
from grammar.automata.regex_ast import regex_escape
from grammar.cfg.compiler import CompiledCFG, clear_cfg_caches
from grammar.constraint import Constraint
from grammar.ebnf.compiler import clear_ebnf_caches, compile_rules
from grammar.ebnf.lark_lower import (
    build_dialect_fallback,
    build_llguidance_lark,
    clear_llguidance_lark_cache,
    uses_llguidance_syntax,
)
from grammar.ebnf.lark_syntax import inline_named_grammars
from grammar.ebnf.syntax import parse_gbnf
from grammar.errors import EmptyLanguageError, GrammarError
from grammar.json_schema.schema import (
    ANY_DEPTH,
    DTYPE_NAMES,
    dtype_to_regex,
    json_schema_to_node,
)
from grammar.json_schema.strict import apply_mode
from grammar.structural.compiler import build_structural_tag, clear_structural_caches
from grammar.tokens.cache import CompileCache
from grammar.tokens.compiled import CompiledGrammar
from grammar.tokens.vocab import TokenVocabulary

logger = logging.getLogger(__name__)

# bounded by count and by automaton bytes (a near-budget automaton holds 100+ MB; a lazy one
# grows as walks build rows: sizes are measured again at each insertion)
_CACHE_BYTES = 1 << 30


def _dfa_bytes(dfa: ByteDFA | LazyDFA) -> int:
    return dfa.nbytes


def _compiled_bytes(g: Any) -> int:
    dfa = getattr(g, "dfa", None)
    return 0 if dfa is None else _dfa_bytes(dfa)


# the automata of regexes and schemas, shared by every vocabulary
_DFA_CACHE: CompileCache = CompileCache(512, _CACHE_BYTES, _dfa_bytes)
# the one cache of compiled constraints, by (Constraint.key, vocabulary hash)
_COMPILED: CompileCache = CompileCache(256, _CACHE_BYTES, _compiled_bytes)
# what `compile` returns: each has `matcher()`
CompiledConstraint = Any


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


def compile(constraint: Constraint, vocab: TokenVocabulary) -> CompiledConstraint:
    """The one compile entry point: `constraint` over `vocab`, cached by (constraint, vocab)
    in the one cache of compiled constraints; thread-safe (two threads asking for the same
    constraint compile it once). A regular constraint gives a `CompiledGrammar`, a lark
    grammar a `CompiledCFG` (or a `CompiledEBNF` in llguidance's dialect), a recursive GBNF
    grammar or structural tag a `CompiledEBNF`: each has `matcher()` (a `grammar.Matcher`)."""
    return _COMPILED.get_or_build((constraint.key, vocab.hash), lambda: _build(constraint, vocab))


def _build(c: Constraint, vocab: TokenVocabulary) -> CompiledConstraint:
    kind = c.kind
    if kind == "regex":
        return CompiledGrammar(_dfa(c.value, c.max_states), vocab, c.value)
    if kind == "choices":
        if not c.value:
            raise GrammarError("choices must not be empty")
        pattern = choices_to_regex(c.value)
        return CompiledGrammar(_dfa(pattern, c.max_states), vocab, pattern)
    if kind == "dtype":
        pattern = dtype_to_regex(DTYPE_NAMES[c.value])
        return CompiledGrammar(_dfa(pattern, c.max_states), vocab, pattern)
    if kind == "json_schema":
        return _build_json_schema(c, vocab)
    if kind == "grammar":
        if uses_llguidance_syntax(c.value):
            return build_llguidance_lark(c.value, vocab, c.start)
        try:
            return CompiledCFG(c.value, vocab, c.start)
        except GrammarError as plain:  # not lark as lark reads it: the engines' dialect?
            return build_dialect_fallback(c.value, vocab, c.start, plain)
    if kind == "ebnf":
        return compile_rules(parse_gbnf(c.value), vocab, c.start, c.value)
    if kind == "structural_tag":
        return build_structural_tag(
            c.value, vocab, json_schema_mode=c.json_schema_mode, whitespace=c.whitespace
        )
    raise GrammarError(f"unknown constraint kind {kind!r}")


def _build_json_schema(c: Constraint, vocab: TokenVocabulary) -> CompiledGrammar:
    loaded = apply_mode(c.value, c.json_schema_mode)
    ws, depth, any_depth = c.whitespace, c.max_recursion_depth, c.any_depth

    def build_dfa() -> ByteDFA | LazyDFA:
        with no_gc():  # the schema's regex tree too: many small containers, no cycles
            try:
                node = json_schema_to_node(loaded, ws, depth, any_depth)
            except EmptyLanguageError:
                return empty_language_dfa()
            dfa = node_to_lazy_dfa(node, c.max_states)
            # freed while the GC is off, unless the NFA keeps it for the members it builds
            # on first read: the GC's first pass after scans only what is kept
            del node
        return dfa

    # the automaton is shared by every vocabulary (the mode's schema, not the request's)
    text = json.dumps(loaded, ensure_ascii=False)
    dfa_key = ("dfa", "schema", text, ws, depth, any_depth, c.json_schema_mode, c.max_states)
    return CompiledGrammar(_DFA_CACHE.get_or_build(dfa_key, build_dfa), vocab, text)


# ---- the compile_* names: thin wrappers over `compile` ---------------------------------------
def compile_regex(
    pattern: str, vocab: TokenVocabulary, *, max_states: int = DEFAULT_MAX_STATES
) -> CompiledGrammar:
    """A constraint from a regex (full match); `compile(Constraint.of("regex", ...))`."""
    return compile(Constraint.of("regex", pattern, max_states=max_states), vocab)


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

    `json_schema_mode` "exact" (the default here) generates the schema's own language;
    "strict" generates only the properties each object declares (`grammar.json_schema.strict`).
    A schema that admits no instance compiles to a constraint that refuses every token
    (`admits_nothing` is true on it): callers that serve requests refuse those."""
    c = Constraint.of(
        "json_schema",
        schema,
        json_schema_mode=json_schema_mode,
        whitespace_pattern=whitespace,
        max_states=max_states,
        max_recursion_depth=max_recursion_depth,
        any_depth=any_depth,
    )
    return compile(c, vocab)


def compile_lark(
    grammar_text: str,
    vocab: TokenVocabulary,
    start: str = "start",
    named_grammars: dict[str, str] | None = None,
) -> Any:
    """A constraint from a lark grammar. Plain lark compiles through `grammar.cfg` (LALR(1),
    a contextual lexer: lark's own meaning); a grammar in llguidance's dialect (`%json`,
    `%regex`, `%llguidance`, special tokens, `&` / `~`, `{M,N}`, rule attributes, `//`
    comments, `-` in names) through `grammar.ebnf.lark_lower` (Earley, so it need not be
    LALR(1)). Both give the matcher interface of every compiled constraint; GrammarError names
    what is refused and where. `named_grammars` (name -> lark text, XGrammar's argument of that
    name, llguidance's grammar list): what `@name` in the text refers to, each a nested grammar
    (`grammar.ebnf.lark_syntax.inline_named_grammars`)."""
    if named_grammars is not None:
        grammar_text = inline_named_grammars(grammar_text, named_grammars)
    return compile(Constraint.of("grammar", grammar_text, start=start), vocab)


def compile_ebnf(text: str, vocab: TokenVocabulary, root: str = "root") -> Any:
    """A constraint from a GBNF / EBNF grammar (llama.cpp's and XGrammar's dialect), with the
    matcher interface of every compiled constraint.

    A grammar with no recursion reachable from `root` compiles to a `CompiledGrammar` (one
    regular language); a recursive one to a `CompiledEBNF` (Earley; ambiguity and left
    recursion are fine). GrammarError naming the line and rule for a syntax error, an undefined
    rule or root, or a root that matches no text."""
    return compile(Constraint.of("ebnf", text, start=root), vocab)


def compile_structural_tag(
    spec: Any,
    vocab: TokenVocabulary,
    *,
    json_schema_mode: str = "strict",
    whitespace: str | None = None,
) -> Any:
    """A constraint from a structural tag (XGrammar's or SGLang's shape, a dict or its JSON
    text; see `grammar.structural.compiler`)."""
    c = Constraint.of(
        "structural_tag", spec, json_schema_mode=json_schema_mode, whitespace_pattern=whitespace
    )
    return compile(c, vocab)


def choices_to_regex(choices: Sequence[str]) -> str:
    """The regex that matches exactly one of `choices` (what `compile_choices` compiles)."""
    return "(" + "|".join(regex_escape(c) for c in choices) + ")"


def compile_choices(choices: Sequence[str], vocab: TokenVocabulary) -> CompiledGrammar:
    """A constraint that matches exactly one of the given strings."""
    return compile(Constraint.of("choices", list(choices)), vocab)


def clear_caches() -> None:
    """Drop every compiled constraint and the automata and pieces they share."""
    _COMPILED.clear()
    _DFA_CACHE.clear()
    clear_cfg_caches()
    clear_ebnf_caches()
    clear_llguidance_lark_cache()
    clear_structural_caches()
