"""Exactness by walking: each instance (a value, or JSON text as written) walked token by token
through a schema's compiled constraint (DeepSeek's tokenizer), against `jsonschema`'s verdict."""

from __future__ import annotations

import json

import jsonschema

import grammar
from tests.support.json_text import serialise
from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab
from tests.support.walks import walk


class Text(str):
    """JSON text given as written (other spellings than the compact serialisation)."""


class Spelt(Text):
    """JSON text whose property names are spelled otherwise than the generator spells them
    (`json.dumps(..., ensure_ascii=False)`): refused if invalid; if valid, may be refused."""


def is_valid(schema: object, instance: object) -> bool:
    cls = jsonschema.validators.validator_for(schema if isinstance(schema, dict) else {})
    return cls(schema).is_valid(instance)


def exact_walks(schema: object, instances: list) -> list[tuple[str, bool, bool]]:
    """(text, accepted, valid) for each instance (a value, or Text to walk as written)."""
    g = grammar.compile_json_schema(schema, deepseek_vocab())
    tok = deepseek_tokenizer()
    out = []
    for inst in instances:
        text = inst if isinstance(inst, Text) else serialise(schema, inst)
        value = json.loads(text) if isinstance(inst, Text) else inst
        ok = walk(g, tok.encode(text, add_special_tokens=False))
        out.append((text, ok, is_valid(schema, value)))
    return out


def assert_exact(schema: object, instances: list) -> None:
    walks = zip(instances, exact_walks(schema, instances), strict=True)
    wrong = [(t, ok) for x, (t, ok, valid) in walks if ok != valid and (ok or type(x) is not Spelt)]
    assert not wrong, wrong
