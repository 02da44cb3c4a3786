"""Every GGUF architecture of the families the engine runs, loaded as it is: one tiny random file
per architecture (tests/support/gguf_families.py: llama.cpp's layout, a mix of 32-element
formats and K-quants), its weights kept in their block formats on the engine's model classes,
and its greedy tokens equal to `transformers`' on the same file's dequantized weights: read by
`transformers` itself (`gguf_file=`) where it reads the architecture, else loaded from the
file's dequantized tensors (Mixtral's experts, DeepSeek)."""

from __future__ import annotations

import pytest
import torch

from runtime import Engine
from runtime.kernels.cpu import quant as cpu_quant
from runtime.kernels.cpu.quant import QuantStack, QuantTensor
from runtime.models.gguf import load_gguf
from tests.support.family_models import WINDOW, family_config
from tests.support.gguf_families import write_family_gguf, written_state
from tests.support.tiny_models import PROMPTS, hf_greedy, smollm_tokenizer, tiny_config

pytestmark = pytest.mark.skipif(cpu_quant.library() is None, reason="no C compiler")

NEW = 8
_GEMMA_TYPES = ["sliding_attention"] * 5 + ["full_attention"]  # llama.cpp's one global in six

# case -> (config factory, whether transformers reads the GGUF itself)
CASES = {
    # Qwen2: q / k / v biases (made random below; transformers starts them at zero)
    "qwen2": (lambda: family_config("qwen2", intermediate_size=256), True),
    # transformers' qwen3 GGUF reader keeps Qwen3's default head_dim of 128
    "qwen3": (lambda: family_config("qwen3", head_dim=128, intermediate_size=256), True),
    # and transformers' qwen3moe reader keeps the default moe_intermediate_size of 768
    "qwen3moe": (lambda: family_config("qwen3_moe", mlp_only_layers=[], moe_intermediate_size=768,
                                       num_hidden_layers=2), True),
    # head_dim 256 (Gemma's): llama.cpp's softmax scale, head_dim ** -0.5, is transformers'
    # default query_pre_attn_scalar (256) then; its window pattern is one global layer in six
    "gemma3": (lambda: family_config("gemma3", head_dim=256, query_pre_attn_scalar=256,
                                     intermediate_size=256, num_hidden_layers=6,
                                     layer_types=_GEMMA_TYPES), True),
    "phi3": (lambda: family_config("phi3", intermediate_size=256), True),
    "mixtral": (lambda: family_config("mixtral", intermediate_size=256), False),
    "deepseek_v2": (lambda: tiny_config("deepseek_v2"), False),
    "deepseek_v3": (lambda: tiny_config("deepseek_v3"), False),
}  # fmt: skip


def _random_model(config, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms of their own (they start at one, or zero for Gemma's 1 + w)
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("proj.bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _oracle(case: str, config, model, written, root):
    """transformers' model of the file's dequantized weights."""
    from transformers import AutoModelForCausalLM

    if CASES[case][1]:
        oracle = AutoModelForCausalLM.from_pretrained(
            str(root), gguf_file=written.path.name, dtype=torch.float32
        ).eval()
    else:
        oracle = model
        names = list(model.state_dict())
        oracle.load_state_dict(written_state(config, written, names))
    oracle.generation_config.eos_token_id = None
    oracle.generation_config.pad_token_id = 0
    return oracle


# the families whose quantized files decode through the one-call C chain (quant_chain.py;
# Qwen2 with its biases; Phi-3 without LongRoPE or partial rotary; the MoE families' experts
# through moe.py's C call; DeepSeek V2's latent attention through mla.py's (V3's tiny q_b is
# narrower than a block: F32, so its file decodes per layer)
CHAINED = {"qwen2", "qwen3", "gemma3", "phi3", "qwen3moe", "mixtral", "deepseek_v2"}

_built: dict[str, tuple] = {}


def _build(case: str, tmp_path_factory) -> tuple:
    """(case, config, what was written, the oracle) for a case, built once per session."""
    if case not in _built:
        config = CASES[case][0]()
        model = _random_model(config)
        root = tmp_path_factory.mktemp(case)
        written = write_family_gguf(root / f"tiny-{case}.gguf", config, model.state_dict())
        _built[case] = (case, config, written, _oracle(case, config, model, written, root))
    return _built[case]


@pytest.fixture(scope="module", params=list(CASES))
def family_file(request, tmp_path_factory):
    return _build(request.param, tmp_path_factory)


def test_weights_stay_in_their_block_formats(family_file):
    case, config, written, _ = family_file
    loaded_config, state = load_gguf(written.path)
    assert loaded_config.num_layers == config.num_hidden_layers
    quantized = [t for t in state.values() if isinstance(t, QuantTensor)]
    kinds = {cpu_quant.type_name(t.qtype) for t in quantized}
    assert {"Q8_0"} <= kinds and kinds & {"Q4_K", "Q6_K", "Q5_K"} or case.startswith("deepseek")
    stored = sum(t.nbytes for t in quantized)
    dense = sum(t.shape[0] * t.shape[1] * 4 for t in quantized)
    assert stored < dense / 3  # as stored: ~1 byte per weight or less, not four
    with Engine(str(written.path), mem_budget_gb=0.05) as engine:
        assert engine.config.architecture == loaded_config.architecture
        # every quantized weight counted as stored (DeepSeek's kv_b: dequantized for MLA)
        assert stored * 0.9 <= engine.stats()["weight_bytes"] < dense / 2


def test_greedy_tokens_equal_transformers_on_the_dequantized_file(family_file):
    case, config, written, oracle = family_file
    tok = smollm_tokenizer()
    prompts = PROMPTS[:4]
    if case == "gemma3":  # past the window of the local layers
        assert len(tok(PROMPTS[1])["input_ids"]) > WINDOW
    with Engine(str(written.path), mem_budget_gb=0.05) as engine:
        results = engine.generate(prompts, max_new_tokens=NEW, temperature=0.0, ignore_eos=True)
        one = engine.generate(prompts[1], max_new_tokens=NEW, temperature=0.0, ignore_eos=True)
        model = engine.model
    for prompt, result in zip(prompts, results, strict=True):
        expected = hf_greedy(oracle, tok(prompt)["input_ids"], NEW)
        assert result.token_ids == expected, f"{case}: {prompt!r}"
    assert one.token_ids == results[1].token_ids  # alone (batch 1) as in the batch
    if case in CHAINED:  # their decode steps in the one-call C chain (gemma3: past the window)
        assert model.decode_path.startswith("one-call decode chain"), model.decode_path
        assert model._chain.runs >= 2 * (NEW - 1)
    elif hasattr(model, "decode_path"):
        assert model.decode_path.startswith("per-layer decode"), model.decode_path


def test_a_qwen3_moe_file_with_dense_layers_names_them(tmp_path):
    """A Qwen3-MoE layer whose file holds a dense `ffn_gate` instead of experts is one of
    `mlp_only_layers`; its greedy tokens still equal the dequantized checkpoint's."""
    config = family_config("qwen3_moe")  # 3 layers, the middle one dense
    model = _random_model(config, seed=1)
    written = write_family_gguf(tmp_path / "moe.gguf", config, model.state_dict())
    loaded, state = load_gguf(written.path)
    assert loaded.moe is not None and loaded.moe.mlp_only_layers == (1,)
    assert isinstance(state["model.layers.0.mlp.experts.3.down_proj.weight"], QuantTensor)
    oracle = _oracle("mixtral", config, model, written, tmp_path)  # the dequantized tensors
    tok = smollm_tokenizer()
    with Engine(str(written.path), mem_budget_gb=0.05) as engine:
        result = engine.generate(PROMPTS[0], max_new_tokens=NEW, temperature=0.0, ignore_eos=True)
    assert result.token_ids == hf_greedy(oracle, tok(PROMPTS[0])["input_ids"], NEW)


def test_gate_and_up_of_one_format_stack_as_one_view_per_expert(tmp_path):
    config = family_config("mixtral")
    model = _random_model(config)
    written = write_family_gguf(tmp_path / "mixtral.gguf", config, model.state_dict())
    _, state = load_gguf(written.path)
    gate, up = (state[f"model.layers.1.mlp.experts.2.{p}_proj.weight"] for p in ("gate", "up"))
    stacked = torch.cat([gate, up])
    assert isinstance(stacked, QuantTensor) and stacked.data.data_ptr() == gate.data.data_ptr()
    mixed = torch.cat([state["model.layers.0.self_attn.k_proj.weight"],
                       state["model.layers.0.self_attn.v_proj.weight"]])  # fmt: skip
    assert isinstance(mixed, QuantStack)  # k Q8_0, v Q5_0: two products


def test_gemma_norms_and_windows_from_the_file(tmp_path_factory):
    _, _, written, _ = _build("gemma3", tmp_path_factory)
    loaded, state = load_gguf(written.path)
    # the file stores 1 + w; the checkpoint convention (w) comes back
    norm = state["model.layers.0.self_attn.q_norm.weight"]
    assert torch.allclose(norm, torch.from_numpy(written.arrays["blk.0.attn_q_norm.weight"]) - 1)
    assert loaded.layer_types[-1] == "full_attention" and loaded.window_layers == 5
    assert loaded.sliding_window == WINDOW and loaded.query_pre_attn_scalar == 256
    assert loaded.local_rope == {"rope_theta": 10000.0}


@pytest.mark.parametrize(("arch", "turns"), [("qwen3", "chatml"), ("gemma3", None)])
def test_a_file_without_a_chat_template_gets_its_familys_turns(tmp_path, arch, turns):
    """SmolLM2's vocabulary has ChatML's markers but not Gemma's: a qwen3 file gets ChatML
    turns, a gemma3 file none (never a format whose markers would be split into pieces)."""
    from runtime.models.chat_templates import CHATML_TURNS
    from runtime.models.gguf import load_tokenizer
    from tests.support.gguf_families import write_default_vocab_gguf

    path = tmp_path / f"{arch}.gguf"
    write_default_vocab_gguf(path, arch)
    tokenizer = load_tokenizer(path)
    assert (tokenizer.chat_template or None) == (CHATML_TURNS if turns else None)
    if turns:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                             add_generation_prompt=True)  # fmt: skip
        assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        assert tokenizer.convert_tokens_to_ids("<|im_start|>") in tokenizer(text)["input_ids"]


_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# each dense family in both dtypes; the MoE ones (their experts the same C call on both paths)
# in one each
_MOE = {"qwen3moe", "mixtral", "deepseek_v2"}
_CHAIN_CASES = [(case, d) for case in sorted(CHAINED - _MOE) for d in _DTYPES]
_CHAIN_CASES += [("qwen3moe", "fp32"), ("mixtral", "bf16"), ("deepseek_v2", "bf16")]


@pytest.mark.parametrize(("case", "dtype_name"), _CHAIN_CASES)
def test_the_decode_chain_matches_the_per_layer_loop(case, dtype_name, tmp_path_factory):
    """A decode-only step's layers in one C call (quant_chain.py) with the family's parts
    (Qwen3's head norms; Gemma's (1 + w) and sandwich norms, GeGLU, local rotary tables and a
    window the longest request outgrows) against decoder.py's per-layer loop on the same file:
    the same greedy tokens, logits equal to rounding (head norms and attention sum in another
    order), for one request and for three."""
    from runtime.attention import make_backend
    from runtime.models.registry import model_class
    from tests.support.forward_batches import decode_run

    dtype = _DTYPES[dtype_name]
    _, _, written, _ = _build(case, tmp_path_factory)
    config, state = load_gguf(written.path)
    model = model_class(config)(config, state, dtype, attention=make_backend("cpu"))
    chain = model._chain
    assert model.decode_path.startswith("one-call decode chain") and chain is not None
    prompts = [[5, 17, 300, 42, 9] * 5, [7, 7, 1000], [12] * 11]
    assert len(prompts[0]) > WINDOW
    for batch in (prompts[:1], prompts):
        chain.runs = 0
        tokens, chained = decode_run(model, dtype, batch, steps=6)
        assert chain.runs == 6
        if model.expert_load.numel():  # the last step's tokens per expert, counted by the C
            k = model.config.moe.num_experts_per_tok
            assert int(model.expert_load.sum()) == len(batch) * k * len(model.expert_load)
        model._chain = None  # the per-layer loop
        plain_tokens, plain = decode_run(model, dtype, batch, steps=6)
        model._chain = chain
        assert torch.equal(tokens, plain_tokens)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(chained, plain, atol=tol * plain.abs().max(), rtol=0)
