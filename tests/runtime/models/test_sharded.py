"""Tensor-parallel layers (runtime/models/sharded.py) against the whole matrices: each rank's
column-parallel rows are its heads' / columns' rows, the ranks' row-parallel partial products sum
to the whole product, the vocabulary lookups sum to the whole embedding and the gathered logits
are the whole head's; one process holds everything and sums nothing."""

from __future__ import annotations

import pytest
import torch

from runtime.config import ModelConfig
from runtime.models.sharded import TensorParallel
from runtime.parallel.comm import LOCAL
from runtime.parallel.shard import Shard

D, HIDDEN, INTER, VOCAB = 4, 16, 12, 11


def _config(heads: int, kv_heads: int) -> ModelConfig:
    return ModelConfig(
        model_type="llama", architecture="LlamaForCausalLM", vocab_size=VOCAB,
        hidden_size=HIDDEN, intermediate_size=INTER, num_layers=1, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=D, rms_norm_eps=1e-6, max_position_embeddings=64,
        rope_theta=10000.0,
    )  # fmt: skip


class _Gather:
    """all_gather_last of two ranks, run one rank at a time: the ranks' padded logits joined
    (the other rank's given), all_reduce the identity (the test sums)."""

    def __init__(self, other: torch.Tensor | None = None, first: bool = True) -> None:
        self.other, self.first = other, first

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        parts = [x, self.other] if self.first else [self.other, x]
        return torch.cat(parts, dim=-1)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (4, 1)], ids=["kv-split", "kv-replicated"])
def test_two_ranks_hold_their_parts_and_their_sums_are_the_whole(heads, kv_heads):
    g = torch.Generator().manual_seed(0)
    config = _config(heads, kv_heads)
    q, k, v = (torch.randn(h * D, HIDDEN, generator=g, dtype=torch.float64)
               for h in (heads, kv_heads, kv_heads))  # fmt: skip
    o = torch.randn(HIDDEN, heads * D, generator=g, dtype=torch.float64)
    gate, up = (torch.randn(INTER, HIDDEN, generator=g, dtype=torch.float64) for _ in range(2))
    down = torch.randn(HIDDEN, INTER, generator=g, dtype=torch.float64)
    attn_out = torch.randn(3, heads * D, generator=g, dtype=torch.float64)
    o_sum, down_sum, mlp_in = 0, 0, torch.randn(3, INTER, generator=g, dtype=torch.float64)
    group = heads // kv_heads
    for rank in range(2):
        tp = TensorParallel(config, Shard(tp_rank=rank, tp_size=2), LOCAL)
        hq, hkv = tp.num_heads, tp.num_kv_heads
        assert hq == heads // 2 and hkv == max(kv_heads // 2, 1)
        kv0 = rank * hq // group if kv_heads < 2 else rank * hkv
        qkv = tp.qkv.weight([q, k, v])
        want = torch.cat([q[rank * hq * D : (rank + 1) * hq * D],
                          k[kv0 * D : (kv0 + hkv) * D], v[kv0 * D : (kv0 + hkv) * D]])  # fmt: skip
        assert torch.equal(qkv, want)
        bias = tp.qkv.bias([None, torch.ones(kv_heads * D, dtype=torch.float64), None],
                           torch.float64)  # fmt: skip
        assert bias.tolist() == [0.0] * (hq * D) + [1.0] * (hkv * D) + [0.0] * (hkv * D)
        assert tp.qkv.bias([None, None, None], torch.float64) is None
        gate_up = tp.gate_up.weight([gate, up])
        cols = slice(rank * INTER // 2, (rank + 1) * INTER // 2)
        assert torch.equal(gate_up, torch.cat([gate[cols], up[cols]]))
        # row parallel: this rank's input columns, the partial products summed over the ranks
        mine = slice(rank * hq * D, (rank + 1) * hq * D)
        o_sum = o_sum + tp.o.reduce(attn_out[:, mine] @ tp.o.weight(o).T)
        down_sum = down_sum + tp.down.reduce(mlp_in[:, cols] @ tp.down.weight(down).T)
    torch.testing.assert_close(o_sum, attn_out @ o.T)
    torch.testing.assert_close(down_sum, mlp_in @ down.T)


def test_the_vocabulary_splits_and_joins_back():
    config = _config(4, 2)
    table = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(1))
    ids = torch.tensor([0, 5, 6, 10, 3])
    ranks = [TensorParallel(config, Shard(tp_rank=r, tp_size=2), _Gather()) for r in range(2)]
    # 11 rows over 2 ranks: 6 and 5, each rank's logits padded to 6 before the gather
    assert [(t.vocab.start, t.vocab.size, t.vocab.per_rank) for t in ranks] == [(0, 6, 6),
                                                                                (6, 5, 6)]
    embedded = sum(t.vocab.embed(ids, t.vocab.rows(table), torch.float32) for t in ranks)
    assert torch.equal(embedded, table[ids])
    hidden = torch.randn(2, HIDDEN)
    logits = [hidden @ t.vocab.rows(table).T for t in ranks]
    padded_second = torch.nn.functional.pad(logits[1], (0, 1), value=float("-inf"))
    tp0 = TensorParallel(config, Shard(tp_rank=0, tp_size=2), _Gather(padded_second, first=True))
    torch.testing.assert_close(tp0.vocab.gather(logits[0]), hidden @ table.T)
    tp1 = TensorParallel(config, Shard(tp_rank=1, tp_size=2), _Gather(logits[0], first=False))
    torch.testing.assert_close(tp1.vocab.gather(logits[1]), hidden @ table.T)


def test_one_process_holds_every_part_and_sums_nothing():
    config = _config(4, 2)
    tp = TensorParallel(config, Shard(), LOCAL)
    assert (tp.num_heads, tp.num_kv_heads) == (4, 2)
    w = torch.randn(HIDDEN, 4 * D)
    assert torch.equal(tp.o.weight(w), w)
    partial = torch.randn(2, HIDDEN)
    assert tp.o.reduce(partial) is partial and tp.down.reduce(partial) is partial
    ids = torch.tensor([1, 10])
    table = torch.randn(VOCAB, HIDDEN)
    assert torch.equal(tp.vocab.embed(ids, tp.vocab.rows(table), torch.float32), table[ids])
    logits = torch.randn(2, VOCAB)
    assert tp.vocab.gather(logits) is logits
