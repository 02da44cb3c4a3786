"""A family's turn format, for GGUF files whose metadata carries no `tokenizer.chat_template`
(Gemma 3 270M's, for one). Each is written here from the family's documented turn markers, and
is used only when the tokenizer's vocabulary has those markers as tokens."""

from __future__ import annotations

# Gemma: `<start_of_turn>role ... <end_of_turn>`, the assistant's role named `model`, a system
# message folded into the first user turn
GEMMA_TURNS = (
    "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] ~ '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{- '<start_of_turn>' ~ role ~ '\n' ~ (prefix if loop.first else '')"
    " ~ (m['content'] | trim) ~ '<end_of_turn>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"
)

# ChatML (Qwen 2 / 3): `<|im_start|>role\n ... <|im_end|>\n` per message
CHATML_TURNS = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' ~ m['role'] ~ '\n' ~ m['content'] ~ '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)

# Phi-3: `<|role|>\n ... <|end|>\n` per message
PHI3_TURNS = (
    "{%- for m in messages -%}"
    "{{- '<|' ~ m['role'] ~ '|>\n' ~ m['content'] ~ '<|end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}"
)

# GGUF architecture -> (turn format, the marker tokens it needs in the vocabulary)
FAMILY_TURNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemma3": (GEMMA_TURNS, ("<start_of_turn>", "<end_of_turn>")),
    "qwen2": (CHATML_TURNS, ("<|im_start|>", "<|im_end|>")),
    "qwen3": (CHATML_TURNS, ("<|im_start|>", "<|im_end|>")),
    "qwen3moe": (CHATML_TURNS, ("<|im_start|>", "<|im_end|>")),
    "phi3": (PHI3_TURNS, ("<|user|>", "<|assistant|>", "<|end|>")),
}


def family_turns(arch: str, vocabulary: dict[str, int]) -> str | None:
    """The turn format of a GGUF architecture whose markers are all tokens of `vocabulary`
    (None: none known, or the vocabulary lacks them)."""
    entry = FAMILY_TURNS.get(arch)
    if entry is None or not all(marker in vocabulary for marker in entry[1]):
        return None
    return entry[0]
