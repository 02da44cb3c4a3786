"""GGUF files run as they are (runtime/models/gguf.py): config, tokenizer and chat template from
the metadata, weights kept in their block formats, greedy tokens against the same model's
dequantized fp32 forward. Tiny random Llamas are written with `gguf`'s writer
(benchmarks/peers/gguf_models.py); the default model's own file runs in the heavy tests."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from benchmarks.peers.gguf_models import write_gguf
from runtime import Engine
from runtime.errors import UnsupportedModelError
from runtime.kernels.cpu import quant as cpu_quant
from runtime.kernels.cpu.quant import QuantStack, QuantTensor
from runtime.models.gguf import load_gguf
from tests.support.tiny_models import PROMPTS, smollm_tokenizer, tiny_config

pytestmark = pytest.mark.skipif(cpu_quant.library() is None, reason="no C compiler")


def tiny_llama(seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config("llama", **overrides)
    return config, AutoModelForCausalLM.from_config(config).eval().state_dict()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A tiny Llama as a Q8_0 GGUF (its v rows Q4_1: a mixed q/k/v as in K-quant files), and a
    folder holding the same weights dequantized (fp32 safetensors)."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("gguf")
    config, state = tiny_llama()
    mixed = {"model.layers.0.self_attn.v_proj.weight": "Q4_1"}
    path = write_gguf(root / "tiny.Q8_0.gguf", config, state, "Q8_0", overrides=mixed)
    _, loaded = load_gguf(path)
    folder = root / "dequantized"
    folder.mkdir()
    dense = {k: (v.dequantize() if isinstance(v, QuantTensor) else v.float()).contiguous()
             for k, v in loaded.items()}  # fmt: skip
    save_file(dense, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    smollm_tokenizer().save_pretrained(folder)
    return path, folder, state


def test_weights_stay_in_their_formats_and_match_the_original(written):
    path, _, state = written
    config, loaded = load_gguf(path)
    assert config.num_layers == 2 and config.num_kv_heads == 2 and config.hidden_size == 64
    q = loaded["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, QuantTensor) and cpu_quant.type_name(q.qtype) == "Q8_0"
    assert q.nbytes == 64 * 64 // 32 * 34  # as stored: 34 bytes per 32 weights
    v = loaded["model.layers.0.self_attn.v_proj.weight"]
    assert cpu_quant.type_name(v.qtype) == "Q4_1"
    # the q / k rows are back in the checkpoint's order: Q8_0 is within half a step of it
    # (plus the fp16 rounding of its scale: 127 x 2^-11 of a step)
    for name in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
        full = f"model.layers.1.{name}.weight"
        w, ref = loaded[full].dequantize(), state[full].float()
        step = ref.abs().reshape(ref.shape[0], -1, 32).amax(-1, keepdim=True) / 127
        assert torch.all((w - ref).reshape(step.shape[0], -1, 32).abs() <= step * 0.6 + 1e-7)
    norm = loaded["model.layers.0.input_layernorm.weight"]
    assert isinstance(norm, torch.Tensor) and torch.equal(norm, state[
        "model.layers.0.input_layernorm.weight"])  # fmt: skip


def test_a_layers_stacked_weights_share_one_buffer_and_stack_without_a_copy(written):
    # q | k | v and gate | up are read one after another: the model's row stacking is a view,
    # so the weights are never held twice while the model is built
    path, _, _ = written
    _, loaded = load_gguf(path)
    q, k, v = (loaded[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
    qkv = torch.cat([q, k, v])
    assert isinstance(qkv, QuantTensor) and qkv.data.data_ptr() == q.data.data_ptr()
    assert torch.equal(qkv.dequantize(), torch.cat([t.dequantize() for t in (q, k, v)]))
    gate, up = (loaded[f"model.layers.1.mlp.{n}_proj.weight"] for n in ("gate", "up"))
    assert torch.cat([gate, up]).data.data_ptr() == gate.data.data_ptr()
    # layer 0's v is Q4_1: its q, k, v load apart and stack as two runs of one format each
    mixed = [loaded[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv"]
    assert isinstance(torch.cat(mixed), QuantStack)
    # the whole weight sliced is the weight itself; part of it a copy
    assert q[:] is q and q[:, 0 : q.shape[1]] is q
    assert q[0:8].data.data_ptr() != q.data.data_ptr()
    assert torch.equal(q[0:8].dequantize(), q.dequantize()[0:8])


def test_engine_runs_the_file_and_reports_stored_weight_bytes(written, tmp_path, monkeypatch):
    path, _, _ = written
    monkeypatch.setenv("SGL_DSL_CACHE_DIR", str(tmp_path / "cache"))
    with Engine(str(path), mem_budget_gb=0.05) as engine:
        r = engine.generate("The quick brown fox", max_new_tokens=8, temperature=0.0,
                            ignore_eos=True)  # fmt: skip
        assert len(r.token_ids) == 8
        assert engine.tokenizer.chat_template  # from the file's metadata
        stored = sum(t.nbytes if isinstance(t, QuantTensor | QuantStack) else
                     t.numel() * t.element_size() for t in load_gguf(path)[1].values())  # fmt: skip
        assert engine.model.weight_bytes() <= stored
    # no weights converted or written: only the tokenizer's entry (gguf_tokenizer.py)
    kept = {p.relative_to(tmp_path / "cache").parts[0] for p in (tmp_path / "cache").rglob("*")}
    assert kept <= {"tokenizers"}


def test_only_a_quantized_model_keeps_the_loading_threads_openmp_team(written, monkeypatch):
    """Quantized products run on the quantized kernels' own pool: the engine keeps an OpenMP
    team on its loading thread so that libgomp's workers spin only briefly beside it; a dense
    model's matmuls are OpenMP regions, whose workers keep spinning (the team is freed)."""
    from runtime.kernels.cpu import fused as cpu_fused

    if not cpu_fused.available(torch.float32):
        pytest.skip("no C compiler: the fused kernels are not built")
    calls = []
    monkeypatch.setattr(cpu_fused, "hold_openmp_team", lambda: calls.append("hold") or 2)
    path, folder, _ = written
    with Engine(str(path), mem_budget_gb=0.05) as quant:
        assert quant.generate("Hello", max_new_tokens=2, temperature=0.0).token_ids
    assert calls == ["hold"]
    with Engine(str(folder), mem_budget_gb=0.05):
        pass
    assert calls == ["hold"]


def test_greedy_tokens_match_the_dequantized_fp32_forward_on_most_prompts(written):
    """The quantized model multiplies int8-quantized activations; its dequantized twin runs
    the same weights in fp32. A random tiny model's logits are close together, so a prompt
    may part where two candidates are within the activations' rounding; most must not."""
    path, folder, _ = written
    prompts = PROMPTS + ["Hello, my name is", "The capital of France is", "import numpy as"]
    with (
        Engine(str(path), mem_budget_gb=0.05) as quant,
        Engine(str(folder), mem_budget_gb=0.05) as dense,
    ):
        a = quant.generate(prompts, max_new_tokens=12, temperature=0.0, ignore_eos=True)
        b = dense.generate(prompts, max_new_tokens=12, temperature=0.0, ignore_eos=True)
        same = sum(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True))
        first = sum(x.token_ids[0] == y.token_ids[0] for x, y in zip(a, b, strict=True))
    assert first >= len(prompts) - 1
    assert same >= len(prompts) * 2 // 3, f"{same} of {len(prompts)} prompts agree"


def test_logits_close_to_the_dequantized_forward(written):
    path, folder, _ = written
    with (
        Engine(str(path), mem_budget_gb=0.05) as quant,
        Engine(str(folder), mem_budget_gb=0.05) as dense,
    ):
        a = quant.generate(PROMPTS[1], max_new_tokens=1, temperature=0.0, logprobs=True,
                           top_logprobs=5)  # fmt: skip
        b = dense.generate(PROMPTS[1], max_new_tokens=1, temperature=0.0, logprobs=True,
                           top_logprobs=5)  # fmt: skip
    assert a.token_ids == b.token_ids
    # int16 activations: the log-probabilities within ~1e-3 of the fp32 forward's
    assert a.top_logprobs[0].keys() == b.top_logprobs[0].keys()
    for token, logprob in b.top_logprobs[0].items():
        assert abs(a.top_logprobs[0][token] - logprob) < 2e-3


@pytest.fixture(scope="module")
def chain_file(tmp_path_factory):
    """A tiny Llama whose layers' matrices are each of one integer-kernel format (Q4_1, layer 0's
    gate | up Q4_0, layer 1's down Q8_0): every layer runs in the decode chain."""
    config, state = tiny_llama(seed=3)
    for name in state:  # norms of their own (transformers starts them all at 1)
        if name.endswith("norm.weight"):
            state[name] = 1 + 0.2 * torch.randn(state[name].shape)
    mixed = {f"model.layers.0.mlp.{n}_proj.weight": "Q4_0" for n in ("gate", "up")}
    mixed["model.layers.1.mlp.down_proj.weight"] = "Q8_0"
    root = tmp_path_factory.mktemp("chain")
    return write_gguf(root / "tiny.Q4_1.gguf", config, state, "Q4_1", overrides=mixed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_decode_chain_gives_the_layer_by_layer_forwards_bits(chain_file, dtype):
    """A decode-only step's layers in one C call (quant_chain.py) against the Python loop over
    the same kernels: the same logits, bit for bit, for one request and for three."""
    from runtime.attention import make_backend
    from runtime.kernels.cpu.quant_chain import DecodeChain
    from runtime.models.llama import LlamaModel
    from tests.support.forward_batches import decode_run

    config, state = load_gguf(chain_file)
    model = LlamaModel(config, state, dtype, attention=make_backend("cpu"))
    chain = model._chain
    assert isinstance(chain, DecodeChain), model.decode_path
    prompts = [[5, 17, 300, 42, 9], [7, 7, 1000], [12] * 11]
    for batch in (prompts[:1], prompts):
        model._chain, chain.runs = chain, 0
        chained_tokens, chained = decode_run(model, dtype, batch, steps=6)
        assert chain.runs == 6
        model._chain = None  # the Python loop
        tokens, plain = decode_run(model, dtype, batch, steps=6)
        assert torch.equal(chained, plain)
        assert torch.equal(chained_tokens, tokens)


def test_an_unsupported_tensor_type_names_the_tensor_and_type(tmp_path):
    config, state = tiny_llama()
    path = tmp_path / "q2k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_context_length(128)
    raw = np.zeros((config.hidden_size, 256 // 256 * 84), dtype=np.uint8)  # Q2_K: 84 B / 256
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.attn_q\.weight.*Q2_K"):
        load_gguf(path)


def test_an_unknown_architecture_is_refused(tmp_path):
    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(path), "phi2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="phi2"):
        load_gguf(path)


def test_stats_report_stored_weights_kv_pool_and_resident_memory(written):
    path, _, _ = written
    with Engine(str(path), mem_budget_gb=0.05) as engine:
        stats = engine.stats()
        assert stats["weight_bytes"] == engine.model.weight_bytes()
        assert stats["kv_pool_bytes"] == stats["kv_capacity_tokens"] * stats["kv_bytes_per_token"]
        assert stats["kv_pool_bytes"] <= 0.05 * 1024**3
        assert 0 < stats["resident_bytes"] <= stats["peak_resident_bytes"]
        # the pool is held as it is written: a short request touches a small part of it
        engine.generate("Hello", max_new_tokens=4, temperature=0.0)
        held = engine.stats()["kv_pool_resident_bytes"]
        assert 0 < held < stats["kv_pool_bytes"] / 4


@pytest.mark.parametrize(
    ("context", "tokens"),
    [(128, 4096), (8192, 8192), (131072, 32768)],
    ids=["short-context-floor", "one-full-context", "long-context-cap"],
)
def test_default_kv_budget_is_one_full_context_capped_by_free_memory(context, tokens, monkeypatch):
    from runtime.config import config_from_dict
    from runtime.memory import budget

    config = config_from_dict(
        {"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": context}
    )  # fmt: skip
    per_token = config.kv_bytes_per_token(4)
    monkeypatch.setattr(budget, "available_memory_bytes", lambda: 1 << 40)
    assert budget.default_kv_budget_bytes(config, 4) == tokens * per_token
    monkeypatch.setattr(budget, "available_memory_bytes", lambda: 4 * per_token * 1000)
    assert budget.default_kv_budget_bytes(config, 4) == per_token * 1000  # a quarter of free


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from tests.support.tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.mark.parametrize("quantization", ["q8_0", "q4_0"])
def test_quantization_of_a_safetensors_folder_at_load(tiny_folder, quantization, tmp_path):
    """The folder quantized at load against a dense engine over the same rounded weights
    (dequantized, saved as fp32): the products, not the rounding, are under test here."""
    import shutil

    from safetensors.torch import save_file

    from runtime.models.loader import load_model_files

    loaded = load_model_files(tiny_folder, quantization)
    w = loaded.state_dict["model.layers.0.mlp.down_proj.weight"]
    assert isinstance(w, QuantTensor) and cpu_quant.type_name(w.qtype) == quantization.upper()
    assert isinstance(loaded.state_dict["model.norm.weight"], torch.Tensor)  # norms stay float
    rounded = tmp_path / "rounded"
    shutil.copytree(tiny_folder, rounded)
    dense_state = {k: (v.dequantize() if isinstance(v, QuantTensor) else v).contiguous()
                   for k, v in loaded.state_dict.items()}  # fmt: skip
    for f in rounded.glob("*.safetensors"):
        f.unlink()
    save_file(dense_state, str(rounded / "model.safetensors"))
    with (
        Engine(str(tiny_folder), mem_budget_gb=0.05, quantization=quantization) as quant,
        Engine(str(rounded), mem_budget_gb=0.05) as dense,
    ):
        assert quant.stats()["weight_bytes"] < dense.stats()["weight_bytes"] / 3
        a = quant.generate(PROMPTS, max_new_tokens=8, temperature=0.0, ignore_eos=True)
        b = dense.generate(PROMPTS, max_new_tokens=8, temperature=0.0, ignore_eos=True)
    same = sum(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True))
    assert same >= len(PROMPTS) - 1, f"{same} of {len(PROMPTS)}"


def test_quantization_is_refused_for_a_gguf_and_an_unknown_format(written, tiny_folder):
    path, _, _ = written
    with pytest.raises(ValueError, match="GGUF"):
        Engine(str(path), mem_budget_gb=0.05, quantization="q8_0")
    with pytest.raises(ValueError, match="q3_x"):
        Engine(str(tiny_folder), mem_budget_gb=0.05, quantization="q3_x")


def test_tensor_parallel_ranks_run_quantized_shards(written):
    """tp_size=2 on the GGUF: each rank slices its rows / whole blocks of columns of the stored
    weights and multiplies them quantized; the halves' sums are added across ranks in another
    order than one process adds them, so a prompt may part where two logits are that close."""
    path, _, _ = written
    prompts = PROMPTS + ["Hello, my name is", "The capital of France is", "import numpy as"]
    kw = dict(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    with Engine(str(path), mem_budget_gb=0.05) as one:
        alone = [r.token_ids for r in one.generate(prompts, **kw)]
    with Engine(str(path), mem_budget_gb=0.05, tp_size=2) as two:
        assert len(two.stats()["worker_pids"]) == 2
        split = [r.token_ids for r in two.generate(prompts, **kw)]
    assert sum(a == b for a, b in zip(alone, split, strict=True)) >= len(prompts) - 1


def test_the_pd_fingerprint_names_the_quantization(tiny_folder):
    """Prefill and decode servers exchange KV only under equal fingerprints: the same folder
    quantized differently (or not at all) must not match; the same quantization must."""
    from runtime.disaggregation.modes import model_fingerprint
    from runtime.models.loader import load_model_files

    def fingerprint(quantization):
        loaded = load_model_files(tiny_folder, quantization)
        return model_fingerprint(loaded.config, loaded.state_dict)

    prints = [fingerprint(q) for q in (None, "q8_0", "q4_0")]
    assert len(set(prints)) == 3
    assert fingerprint("q4_0") == prints[2]
