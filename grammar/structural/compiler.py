"""`compile_structural_tag(spec, vocab)`: a structural tag as a token constraint.

The spec becomes grammar rules (`grammar.structural.spec`) and goes through the GBNF compiler's
`compile_rules`: a spec whose pieces are all regular (const strings, JSON Schemas, regexes,
free text, regular EBNF) is one regular language, compiled to a `CompiledGrammar` over a lazy
DFA (only the states a generation visits are built, so compile time hardly grows with the
number of tags; the forced text of a tag's begin after its trigger and of its end string comes
from the compressed DFA, for jump-forward); a spec with a recursive EBNF grammar inside compiles
to a `CompiledEBNF`. Cached by (spec, mode, whitespace, vocab.hash).
"""

from __future__ import annotations

import json
from typing import Any

from grammar.ebnf.compiler import compile_rules
from grammar.errors import GrammarError
from grammar.structural.forced_masks import ForcedMasks
from grammar.structural.spec import SpecReader, clear_schema_leaves
from grammar.tokens.cache import CompileCache
from grammar.tokens.compiled import CompiledGrammar
from grammar.tokens.vocab import TokenVocabulary

_CACHE: CompileCache = CompileCache(max_entries=128)


def compile_structural_tag(
    spec: Any,
    vocab: TokenVocabulary,
    *,
    json_schema_mode: str = "strict",
    whitespace: str | None = None,
) -> Any:
    """A constraint from a structural tag: XGrammar's `{"type": "structural_tag", "format":
    {...}}` (or a bare format object), or SGLang's `{"structures": [...], "triggers": [...]}`;
    a dict or its JSON text. JSON-Schema contents use `json_schema_mode` ("strict" by default:
    only declared properties) and `whitespace` (compact by default). GrammarError naming the
    field's path for a malformed or unsupported spec."""
    if isinstance(spec, str | bytes):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise GrammarError(f"structural tag: not valid JSON: {e}") from None
    try:
        text = json.dumps(spec, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise GrammarError(f"structural tag: not JSON data: {e}") from None

    return _CACHE.get_or_build(
        ("structural", text, json_schema_mode, whitespace, vocab.hash),
        lambda: build_structural_tag(spec, vocab, json_schema_mode=json_schema_mode,
                                     whitespace=whitespace, text=text),
    )  # fmt: skip


def build_structural_tag(
    spec: Any,
    vocab: TokenVocabulary,
    *,
    json_schema_mode: str = "strict",
    whitespace: str | None = None,
    text: str | None = None,
) -> Any:
    """`compile_structural_tag` without its cache, for `grammar.compile` (which caches);
    `spec` a dict."""
    if text is None:
        text = json.dumps(spec, sort_keys=True, ensure_ascii=False)
    reader = SpecReader(json_schema_mode, whitespace)
    compiled = compile_rules(reader.read(spec), vocab, "root", text)
    if isinstance(compiled, CompiledGrammar):
        if compiled.dfa.lazy:  # the states inside forced text: masks by their text
            compiled.index.shortcut = ForcedMasks(compiled.dfa, vocab, compiled.index)
        _warm_triggers(compiled, reader.triggers)
    return compiled


def _warm_triggers(g: CompiledGrammar, triggers: list[str]) -> None:
    """Compute now the masks of the states a trigger passes through from the start (free text
    that has begun a trigger): every generation that calls a tool visits them, and a first
    visit costs a vocabulary walk. A few states per trigger."""
    for trigger in dict.fromkeys(triggers):
        m = g.matcher()
        for b in trigger.encode("utf-8"):
            try:
                m.advance_bytes(bytes([b]))
            except GrammarError:
                break  # the trigger cannot start here (e.g. at_least_one: a tag comes first)
            m.bitmask()


def clear_structural_caches() -> None:
    """Drop compiled structural tags and the JSON Schema trees they share."""
    _CACHE.clear()
    clear_schema_leaves()
