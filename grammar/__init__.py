"""grammar: JSON Schema / regex / choices -> byte-level DFA -> per-state token masks.

vocab = TokenVocabulary.from_tokenizer(hf_tokenizer)
g = compile_json_schema(schema, vocab)      # cached by (constraint, vocab.hash)
m = g.matcher(); m.mask(); m.advance(token_id); m.forced_text()
"""

from grammar.api import clear_caches, compile_choices, compile_json_schema, compile_regex
from grammar.compiled import CompiledGrammar
from grammar.errors import GrammarError, UnsupportedSchemaError
from grammar.fsm import ByteDFA, regex_to_dfa
from grammar.json_schema import dtype_to_regex, json_schema_to_regex
from grammar.matcher import Matcher
from grammar.vocab import TokenVocabulary

__all__ = [
    "ByteDFA",
    "CompiledGrammar",
    "GrammarError",
    "Matcher",
    "TokenVocabulary",
    "UnsupportedSchemaError",
    "clear_caches",
    "compile_choices",
    "compile_json_schema",
    "compile_regex",
    "dtype_to_regex",
    "json_schema_to_regex",
    "regex_to_dfa",
]
