"""Fixtures for the DSL tests: a scripted fake backend for pure-frontend behaviour.

The fake never models a language; it answers gens from a script so the tests can check
tracing, roles, messages and fork bookkeeping exactly. Behaviour tests use the real engine.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2

from sgl_dsl.backend.base import Backend, GenChunk, GenOutput
from sgl_dsl.chat_template import ChatTemplate

CHATML = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "{{ '<|im_start|>system\nDefault system.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatMLTokenizer:
    """Just enough of a tokenizer for `ChatTemplate.from_tokenizer`."""

    chat_template = CHATML
    bos_token = None

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False, **kw: Any) -> str:
        return jinja2.Template(self.chat_template).render(messages=messages, **kw)


class FakeBackend(Backend):
    """Answers a gen whose prompt ends with key `k` with `answers[k]` ("x" if none match).

    `scores[choice]` is the log-prob of every token of a choice (one token per word) after a
    non-empty prompt; after the empty (unconditional) prompt every token scores -5.
    Every call is recorded in `calls` as (kind, prompt, detail).
    """

    def __init__(
        self,
        answers: dict[str, str] | None = None,
        scores: dict[str, float] | None = None,
    ) -> None:
        self.answers = answers or {}
        self.scores = scores or {}
        self.calls: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        self._template = ChatTemplate.from_tokenizer(ChatMLTokenizer())

    def chat_template(self) -> ChatTemplate:
        return self._template

    def _answer(self, prompt: str, params: dict[str, Any]) -> str:
        for suffix, answer in self.answers.items():
            if prompt.endswith(suffix):
                return answer
        return "x"

    def generate(self, prompt: str, params: dict[str, Any]) -> GenOutput:
        with self._lock:
            self.calls.append(("generate", prompt, dict(params)))
        text = self._answer(prompt, params)
        return GenOutput(text, "stop", len(prompt), 0, len(text))

    def generate_stream(self, prompt: str, params: dict[str, Any]) -> Iterator[GenChunk]:
        out = self.generate(prompt, params)
        for i, ch in enumerate(out.text):
            yield GenChunk(ch, out if i == len(out.text) - 1 else None)

    def score(self, prompt: str, continuations: list[str]) -> list[list[float]]:
        with self._lock:
            self.calls.append(("score", prompt, list(continuations)))
        if not prompt:  # the unconditional prompt: every choice equally likely
            return [[-5.0] * len(c.split()) for c in continuations]
        return [[self.scores.get(c.strip(), -5.0)] * len(c.split()) for c in continuations]

    def commit_prefix(self, prefix: str) -> None:
        with self._lock:
            self.calls.append(("commit", prefix, None))


# ---- real engines ------------------------------------------------------------------------

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_tiny_llama(folder: Path, seed: int = 0) -> Path:
    """A random 2-layer Llama with SmolLM2's real tokenizer and chat template, saved to `folder`.

    Its outputs are noise; it exercises the whole engine path (tokenizer, template, paged KV,
    radix cache, scheduler) in well under a second per program.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from runtime.default_model import ensure_default_model

    source = ensure_default_model()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, folder / name)
    return folder


ENGINE_KWARGS = {"mem_budget_gb": 0.25}
# the SGLang test programs the heavy tests run on the default model (the tiny model runs all of
# them, structurally): one of each kind, short (the whole set took ~150 s on 2 cores)
ON_THE_DEFAULT_MODEL = ("few_shot_qa", "select", "decode_json_regex", "regex", "tool_use",
                        "hellaswag_select")  # fmt: skip
DEFAULT_MODEL_BUDGET = 24
