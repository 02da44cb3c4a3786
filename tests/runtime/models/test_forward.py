"""The engine's forward pass against transformers' forward on the same weights (fp32)."""

from __future__ import annotations

import json

import pytest
import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.config import load_config
from runtime.errors import ModelNotFoundError, UnsupportedModelError
from runtime.memory.kv_pool import KVPool
from runtime.models.llama import LlamaModel
from runtime.models.loader import load_model_files
from runtime.models.registry import model_class
from tests.support.tiny_models import LLAMA3_ROPE, YARN, hf_model, make_tiny_model

TOLERANCE = 1e-4


def _prefill_then_decode(model, ids: list[int], split: int) -> torch.Tensor:
    """Logits of every position: prefill ids[:split] in one extend, then decode one by one."""
    page_size = 4
    pool = KVPool(model.config, 64, page_size, torch.float32)
    pages = torch.arange(1, 64, dtype=torch.int32)[None]
    empty = torch.zeros(0, 63, dtype=torch.int32)
    none = torch.zeros(0, dtype=torch.int32)

    def slots(lo: int, hi: int) -> torch.Tensor:
        pos = torch.arange(lo, hi)
        return pages[0, pos // page_size].long() * page_size + pos % page_size

    rows = []
    batch = ForwardBatch(
        torch.tensor(ids[:split]), torch.arange(split), slots(0, split), 0, empty, none,
        pages, torch.tensor([0], dtype=torch.int32), torch.tensor([split], dtype=torch.int32),
        torch.arange(split),
    )  # fmt: skip
    rows.append(model.forward(batch, pool))
    for p in range(split, len(ids)):
        batch = ForwardBatch(
            torch.tensor([ids[p]]), torch.tensor([p]), slots(p, p + 1), 1, pages,
            torch.tensor([p + 1], dtype=torch.int32), empty, none, none, torch.tensor([0]),
        )  # fmt: skip
        rows.append(model.forward(batch, pool))
    return torch.cat(rows)


@pytest.mark.parametrize(
    ("kind", "overrides"),
    [
        pytest.param("llama", {}, id="llama-untied"),
        pytest.param("llama", {"tie_word_embeddings": True}, id="llama-tied"),
        pytest.param("llama", {"rope_scaling": LLAMA3_ROPE}, id="llama3-rope-scaling"),
        pytest.param(
            "llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, id="linear-rope"
        ),
        pytest.param("llama", {"attention_bias": True, "mlp_bias": True}, id="llama-biases"),
        pytest.param("llama", {"num_key_value_heads": 4}, id="llama-mha"),
        pytest.param("qwen2", {}, id="qwen2-qkv-bias"),
        pytest.param("qwen2", {"tie_word_embeddings": True}, id="qwen2-tied"),
        pytest.param("mistral", {"sliding_window": None}, id="mistral"),
        pytest.param("deepseek_v3", {}, id="deepseek-v3"),
        pytest.param("deepseek_v3", {"tie_word_embeddings": True}, id="deepseek-v3-tied"),
        pytest.param(
            "deepseek_v3", {"rope_scaling": YARN, "rope_interleave": False}, id="deepseek-v3-yarn"
        ),
        pytest.param("deepseek_v2", {}, id="deepseek-v2"),
        pytest.param(
            "deepseek_v2",
            {
                "q_lora_rank": 24,
                "topk_method": "group_limited_greedy",
                "n_group": 2,
                "topk_group": 1,
                "rope_scaling": YARN,
            },
            id="deepseek-v2-lora-groups-yarn",
        ),  # fmt: skip
    ],
)
def test_logits_match_transformers(tmp_path, kind, overrides):
    folder = make_tiny_model(tmp_path, kind, **overrides)
    loaded = load_model_files(folder)
    model = model_class(loaded.config)(loaded.config, loaded.state_dict, torch.float32)
    ids = torch.randint(
        0, loaded.config.vocab_size, (90,), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        expected = hf_model(folder)(ids[None]).logits[0]
    got = _prefill_then_decode(model, ids.tolist(), split=70)
    diff = (got - expected).abs().max().item()
    print(f"{kind} {overrides}: max abs logit diff {diff:.2e}")
    assert diff < TOLERANCE
    if kind.startswith("deepseek"):  # the decompressing path gives the same logits
        model.absorb = False
        diff = (_prefill_then_decode(model, ids.tolist(), split=70) - expected).abs().max()
        assert diff.item() < TOLERANCE


def test_tied_embeddings_share_one_tensor(tmp_path):
    loaded = load_model_files(make_tiny_model(tmp_path, tie_word_embeddings=True))
    model = LlamaModel(loaded.config, loaded.state_dict, torch.float32)
    assert model.lm_head is model.embed


def test_missing_folder_names_the_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        load_model_files(tmp_path / "no-such-model")


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]})
    )
    with pytest.raises(UnsupportedModelError, match="gpt_neox"):
        load_config(tmp_path)


def test_model_class_comes_from_the_architecture_registry(tmp_path):
    from runtime import Engine
    from runtime.models.registry import MODELS, model_class

    folder = make_tiny_model(tmp_path)
    config = load_config(folder)
    assert config.architecture == "LlamaForCausalLM"
    assert model_class(config) is LlamaModel
    # a head this engine does not run, on a supported model_type: named, with the supported ones
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["LlamaForSequenceClassification"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError) as err:
        Engine(str(folder))
    message = str(err.value)
    assert "'LlamaForSequenceClassification'" in message
    assert all(name in message for name in MODELS)
    # a bare config without `architectures` stands for its model_type's causal LM
    del cfg["architectures"]
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_config(folder).architecture == "LlamaForCausalLM"


def test_unsupported_rope_scaling_is_named(tmp_path):
    folder = make_tiny_model(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_scaling"] = {"rope_type": "longrope", "factor": 4.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="longrope"):
        load_config(folder)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_folders_tokenizer_is_auto_tokenizers_without_the_familys_config(tmp_path, kind):
    # the tokenizer a folder loads with equals AutoTokenizer's, and loading it imported no
    # model family's config module (a fresh interpreter: this one has them all)
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from runtime.models.loader import load_folder_tokenizer

    folder = make_tiny_model(tmp_path, kind=kind)
    ours, theirs = load_folder_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    assert type(ours) is type(theirs) and len(ours) == len(theirs)
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert ours.chat_template == theirs.chat_template
    for text in ("Hello <|im_start|> world", " naïve  café\n\tx", "<|endoftext|>"):
        assert ours.encode(text) == theirs.encode(text)
    family = f"transformers.models.{kind}.configuration_{kind}"
    code = (
        "import sys; from pathlib import Path; from runtime.models.loader import "
        f"load_folder_tokenizer; load_folder_tokenizer(Path({str(folder)!r})); "
        f"print([m for m in ({family!r}, 'torch.distributed.tensor') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_folder_with_remote_code_reads_its_config_itself(tmp_path):
    from runtime.models.loader import _model_type_only

    folder = make_tiny_model(tmp_path)
    assert _model_type_only(folder) is not None
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "custom.Config"}
    (folder / "config.json").write_text(json.dumps(config))
    assert _model_type_only(folder) is None
