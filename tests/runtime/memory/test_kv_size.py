"""`python -m runtime.kv_size`: bytes per token and totals, GQA against MHA."""

from __future__ import annotations

import json

import pytest

from runtime.config import config_from_dict
from runtime.memory.kv_size import kv_size, main

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "vocab_size": 128256,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}  # fmt: skip


@pytest.mark.parametrize(
    ("dtype_bytes", "per_token", "at_32k"),
    [
        pytest.param(2, 128 * 1024, 4 * 1024**3, id="bf16"),
        pytest.param(4, 256 * 1024, 8 * 1024**3, id="fp32"),
    ],
)
def test_llama_31_8b_figures(dtype_bytes, per_token, at_32k):
    size = kv_size(config_from_dict(LLAMA_31_8B), context=32768, batch=1, dtype_bytes=dtype_bytes)
    assert size.bytes_per_token == per_token
    assert size.total_bytes == at_32k
    assert size.mha_bytes_per_token == 4 * per_token  # 32 heads instead of 8 kv heads


def test_cli_prints_the_table(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_31_8B))
    assert main([str(path), "--context", "32768", "--batch", "4", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "131072 (128 KiB)" in out
    assert "4 GiB" in out and "16 GiB" in out and "64 GiB" in out
    assert "4x less" in out


def test_deepseek_v3_published_config_latent_figures(tmp_path, capsys):
    """transformers' DeepseekV3Config() is the published shape: 61 layers, latent 512 + 64."""
    from transformers import DeepseekV3Config

    config = config_from_dict(DeepseekV3Config().to_dict())
    size = kv_size(config, context=65536, batch=1, dtype_bytes=2)
    assert size.bytes_per_token == 61 * (512 + 64) * 2 == 70272
    assert size.mha_bytes_per_token == 128 * (192 + 128) * 61 * 2 == 4_997_120
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DeepseekV3Config().to_dict()))
    assert main([str(path), "--context", "65536", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "= 70272 (70,272 bytes, 68.62 KiB)" in out
    assert "4.29 GiB" in out  # 64k tokens of latents
    assert "4,997,120 bytes per token" in out and "71.1x less than MHA" in out
    assert "GQA (8 kv heads)" in out  # 8 x 320 x 61 x 2 = 312,320 bytes
    assert "305 KiB" in out
