"""grammar: JSON Schema / regex / choices -> byte-level DFA -> per-state token masks.

vocab = TokenVocabulary.from_tokenizer(hf_tokenizer)
c = Constraint.from_fields(json_schema=schema)   # what a request names (one kind, checked)
g = compile(c, vocab)                       # the one entry point, cached by (c, vocab.hash)
g = compile_json_schema(schema, vocab)      # the same through a wrapper
m = g.matcher(); m.mask(); m.advance(token_id); m.forced_text()
g = compile_lark(LARK_TEXT, vocab)          # context-free, the same matcher interface
g = compile_ebnf(GBNF_TEXT, vocab)          # llama.cpp / XGrammar GBNF, any rule as root
g = compile_structural_tag(SPEC, vocab)     # XGrammar's / SGLang's structural tags
"""

from grammar.api import (
    choices_to_regex,
    clear_caches,
    compile,
    compile_choices,
    compile_ebnf,
    compile_json_schema,
    compile_lark,
    compile_regex,
    compile_structural_tag,
)
from grammar.automata import intersect as _intersect  # noqa: F401  no compile pays a module import
from grammar.automata.fsm import ByteDFA, regex_to_dfa
from grammar.cfg.compiler import CompiledCFG
from grammar.constraint import KINDS, Constraint, ConstraintError
from grammar.ebnf.compiler import CompiledEBNF
from grammar.errors import EmptyLanguageError, GrammarError, UnsupportedSchemaError
from grammar.json_schema import numbers as _decimal_numbers  # noqa: F401  loaded with the package:
from grammar.json_schema.lark import compile_json_schema_cfg, json_schema_to_lark
from grammar.json_schema.schema import DTYPE_NAMES, dtype_to_regex, json_schema_to_regex
from grammar.tokens.compiled import CompiledGrammar
from grammar.tokens.matcher import Matcher, MatcherBase
from grammar.tokens.vocab import TokenVocabulary


def prebuild(vocab: TokenVocabulary | None = None) -> None:
    """Build now what later compiles share, so that no request's first mask waits for it: the
    format automata (date-time, email, uri, ...; read from the native cache folder after the
    first process built them), the automata of
    unconstrained values and plain scalars (~0.05 s) and, given one, the vocabulary's token
    tables. The engine runs this on its grammar thread at start. `clear_caches` keeps them
    (they depend on no schema)."""
    from grammar.json_schema import formats
    from grammar.json_schema import schema as json_schema

    formats.prebuild()
    json_schema.prebuild()
    if vocab is not None:
        from grammar import warm
        from grammar.tokens import native

        vocab.prepared()
        native.trie_of(vocab)  # the C walk's token trie (~0.2 s; None without a compiler)
        warm.prebuild(vocab)  # the token sets JSON strings share (string content, maxLength)


__all__ = [
    "ByteDFA",
    "choices_to_regex",
    "CompiledCFG",
    "CompiledEBNF",
    "CompiledGrammar",
    "compile",
    "Constraint",
    "ConstraintError",
    "EmptyLanguageError",
    "GrammarError",
    "KINDS",
    "Matcher",
    "MatcherBase",
    "TokenVocabulary",
    "UnsupportedSchemaError",
    "clear_caches",
    "compile_choices",
    "compile_ebnf",
    "compile_json_schema",
    "compile_json_schema_cfg",
    "compile_lark",
    "compile_regex",
    "compile_structural_tag",
    "DTYPE_NAMES",
    "dtype_to_regex",
    "json_schema_to_lark",
    "json_schema_to_regex",
    "prebuild",
    "regex_to_dfa",
]
