"""A GGUF's tokenizer read from the cache (runtime/models/gguf_tokenizer.py) against the one
transformers' GGUF converters build from the same metadata (the oracle): the same backend,
special tokens, chat template, and the same encode / decode on a corpus with special tokens, on
the first load (converted here or in a child process) and on every load after it."""

from __future__ import annotations

import shutil

import pytest

from runtime.models import gguf_tokenizer
from runtime.models.chat_templates import family_turns
from runtime.models.gguf import load_tokenizer, read_header
from tests.support.gguf_families import write_default_vocab_gguf

CORPUS = [
    "Hello world",
    "  two leading spaces and   three inside",
    "the theme of these thirty three things",
    "unicode: déjà vu, 東京, emoji 🙂 and tabs\tand\nnew lines\n\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>user\nHi<|im_end|>\n",
    "<bos>text after a bos<eos> and <mark> inside",
    "",
]
PIECES = ["▁", "t", "h", "e", "r", "o", "m", "s", "i", "w", "l", "d", "n", "a", "c", "u"]
WORDS = ["th", "he", "the", "▁t", "▁th", "▁the", "er", "▁them", "me", "▁w", "or", "ld",
         "▁wor", "▁world", "in", "▁in", "▁s", "▁so", "▁a", "an", "▁an", "is", "▁is"]  # fmt: skip


def _sentencepiece_gguf(path, arch: str, template: str | None = None) -> None:
    """A small sentencepiece ("llama") vocabulary with scores and no merges (transformers
    recovers them), control, user-defined, byte and all-space tokens."""
    import gguf

    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<mark>"]
    types = [3, 3, 3, 2, 3, 3, 4]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    tokens += PIECES + WORDS + ["  ", "   "]
    types += [1] * (len(PIECES) + len(WORDS) + 2)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 263 + [-float(i) for i in range(len(tokens) - 263)])
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    if template is not None:
        writer.add_chat_template(template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _oracle(path):
    """What load_tokenizer built before the cache: the converter's backend wrapped directly."""
    from transformers import PreTrainedTokenizerFast

    backend, kwargs = gguf_tokenizer.convert(path)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
    if not tokenizer.chat_template:
        arch = read_header(path)[0]["general.architecture"]
        tokenizer.chat_template = family_turns(arch, tokenizer.get_vocab())
    return tokenizer


def _assert_field_equal(ours, oracle) -> None:
    assert type(ours) is type(oracle)
    assert ours.backend_tokenizer.to_str() == oracle.backend_tokenizer.to_str()
    assert ours.get_vocab() == oracle.get_vocab() and len(ours) == len(oracle)
    assert repr(ours.added_tokens_decoder) == repr(oracle.added_tokens_decoder)
    for name in ("bos_token", "eos_token", "unk_token", "pad_token", "all_special_tokens",
                 "all_special_ids", "chat_template", "add_bos_token", "add_eos_token"):  # fmt: skip
        assert getattr(ours, name, None) == getattr(oracle, name, None), name
    for special in (True, False):
        ids = [ours(text, add_special_tokens=special)["input_ids"] for text in CORPUS]
        assert ids == [oracle(text, add_special_tokens=special)["input_ids"] for text in CORPUS]
        for row in ids:
            for skip in (True, False):
                assert ours.decode(row, skip_special_tokens=skip) == oracle.decode(
                    row, skip_special_tokens=skip
                )
    if oracle.chat_template:
        turns = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Yo"},
                 {"role": "user", "content": "Again"}]  # fmt: skip
        text = oracle.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        assert ours.apply_chat_template(turns, tokenize=False, add_generation_prompt=True) == text


def _entries(cache):
    return sorted(p.name for p in (cache / "tokenizers").iterdir() if not p.name.startswith("."))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("SGL_DSL_CACHE_DIR", str(folder))
    return folder


def _no_conversion(*_args):
    raise AssertionError("converted again")


@pytest.mark.parametrize("kind", ["gemma3", "phi3", "llama-template", "byte-level"])
def test_the_cached_tokenizer_equals_the_converted_one_first_and_after(kind, cache, tmp_path,
                                                                       monkeypatch):  # fmt: skip
    path = tmp_path / "model.gguf"
    if kind == "byte-level":
        write_default_vocab_gguf(path, "qwen3", pre="qwen2")
    else:
        template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
        arch = "llama" if kind == "llama-template" else kind
        _sentencepiece_gguf(path, arch, template if kind == "llama-template" else None)
    oracle = _oracle(path)
    first = load_tokenizer(path)  # converted here (a small vocabulary), written to the cache
    assert len(_entries(cache)) == 1
    _assert_field_equal(first, oracle)
    monkeypatch.setattr(gguf_tokenizer, "convert", _no_conversion)
    copy = tmp_path / "renamed.gguf"  # keyed by content: a copy finds the same entry
    shutil.copyfile(path, copy)
    for again in (load_tokenizer(path), load_tokenizer(copy)):
        _assert_field_equal(again, oracle)
    assert len(_entries(cache)) == 1


def test_a_large_vocabulary_converts_in_a_child_process(cache, tmp_path, monkeypatch):
    path = tmp_path / "gemma.gguf"
    _sentencepiece_gguf(path, "gemma3")
    oracle = _oracle(path)
    monkeypatch.setattr(gguf_tokenizer, "CHILD_TOKENS", 1)
    monkeypatch.setattr(gguf_tokenizer, "convert", _no_conversion)  # not in this process
    _assert_field_equal(load_tokenizer(path), oracle)
    assert len(_entries(cache)) == 1


def test_a_changed_file_gets_its_own_entry_and_a_damaged_entry_is_rebuilt(cache, tmp_path):
    path = tmp_path / "model.gguf"
    _sentencepiece_gguf(path, "llama", "{{ messages[0]['content'] }}")
    load_tokenizer(path)
    (old,) = _entries(cache)
    _sentencepiece_gguf(path, "llama", "{{ messages[-1]['content'] }}")
    changed = load_tokenizer(path)
    assert changed.chat_template == "{{ messages[-1]['content'] }}"
    assert len(_entries(cache)) == 2
    (new,) = set(_entries(cache)) - {old}
    (cache / "tokenizers" / new / "tokenizer.json").write_text("{ not json")
    _assert_field_equal(load_tokenizer(path), _oracle(path))
