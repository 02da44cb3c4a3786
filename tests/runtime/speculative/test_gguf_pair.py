"""The speculative benchmark's target file: a dense folder written as a GGUF (`folder_gguf`),
so that llama-server and the engine run one pair of files. The written file decodes greedy
token for token as the folder does, stores the matrices in the type asked for, is written once,
and drafts for itself under STANDALONE speculation with output equal to no speculation."""

from __future__ import annotations

import pytest

from benchmarks.peers.gguf_models import folder_gguf
from runtime import Engine
from runtime.kernels.cpu import quant as cpu_quant
from runtime.models.gguf import read_header
from tests.support.tiny_models import PROMPTS, make_tiny_model

pytestmark = pytest.mark.skipif(cpu_quant.library() is None, reason="no C compiler")

KW = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny-pair") / "model", seed=3)


def test_the_f32_file_decodes_as_the_folder_does(folder, tmp_path):
    path = folder_gguf(folder, tmp_path / "tiny.F32.gguf", "F32")
    meta, tensors, _ = read_header(path)
    assert meta["general.architecture"] == "llama"
    assert any(name == "blk.1.attn_q.weight" for name, *_ in tensors)
    with Engine(str(folder), mem_budget_gb=0.05) as dense, \
            Engine(str(path), mem_budget_gb=0.05) as written:  # fmt: skip
        a = [r.token_ids for r in dense.generate(PROMPTS, **KW)]
        b = [r.token_ids for r in written.generate(PROMPTS, **KW)]
    assert a == b


def test_the_q8_file_stores_q8_matrices_is_written_once_and_drafts_for_itself(folder, tmp_path):
    import gguf

    path = folder_gguf(folder, tmp_path / "tiny.Q8_0.gguf", "Q8_0")
    _, tensors, _ = read_header(path)
    kinds = {name: kind for name, _, kind, _ in tensors}
    assert kinds["blk.0.ffn_down.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert kinds["output_norm.weight"] == gguf.GGMLQuantizationType.F32
    stamp = path.stat().st_mtime_ns
    assert folder_gguf(folder, path, "Q8_0") == path and path.stat().st_mtime_ns == stamp
    spec = {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": str(path),
            "speculative_num_draft_tokens": 4}  # fmt: skip
    with Engine(str(path), mem_budget_gb=0.05) as plain, \
            Engine(str(path), mem_budget_gb=0.05, **spec) as drafted:  # fmt: skip
        drafted.scheduler.call(lambda: setattr(drafted.scheduler.speculation, "cost_aware", False))
        # one request at a time: a large batch steps aside from speculation
        a = [plain.generate(p, **KW).token_ids for p in PROMPTS[:3]]
        b = [drafted.generate(p, **KW).token_ids for p in PROMPTS[:3]]
        stats = drafted.stats()
    assert a == b
    assert stats["spec_verify_steps"] > 0 and stats["spec_accepted_tokens"] > 0


def test_a_folder_without_weights_is_refused_by_name(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    make_tiny_model(tmp_path / "src")
    (empty / "config.json").write_text((tmp_path / "src" / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="safetensors"):
        folder_gguf(empty, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
