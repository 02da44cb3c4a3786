"""What one rank holds of a model.

Ranks form `pp_size` pipeline stages of `group` ranks each, `group = max(tp_size, ep_size)`:
within a stage the ranks split attention heads and MLP columns (tensor parallel) and / or the
routed experts (expert parallel); across stages they split the layers into contiguous blocks.

Tensor parallel: query heads split evenly; KV heads split when `tp_size` divides them, else
replicated (each rank keeps the one KV head its query heads read, which needs `tp_size` to be a
multiple of the KV heads); MLP intermediate columns and the vocabulary (embedding rows and LM
head) split evenly, the vocabulary padded to a multiple of `tp_size`.
Expert parallel: routed experts dealt out in contiguous blocks; attention, dense layers and
shared experts are replicated on the stage's ranks (each computes them for every token).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from runtime.config import ModelConfig
from runtime.errors import ParallelConfigError


@dataclass(slots=True, frozen=True)
class Shard:
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    ep_rank: int = 0
    ep_size: int = 1
    layer_start: int = 0
    layer_end: int | None = None  # None: every layer

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    def layers(self, num_layers: int) -> range:
        return range(self.layer_start, num_layers if self.layer_end is None else self.layer_end)


SINGLE = Shard()


def stage_layers(num_layers: int, pp_size: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) layer blocks, the first stages one longer when uneven."""
    base, extra = divmod(num_layers, pp_size)
    out, start = [], 0
    for s in range(pp_size):
        end = start + base + (s < extra)
        out.append((start, end))
        start = end
    return out


def validate(config: ModelConfig, tp_size: int, pp_size: int, ep_size: int) -> None:
    """ParallelConfigError naming the counts that do not divide."""
    for name, value in (("tp_size", tp_size), ("pp_size", pp_size), ("ep_size", ep_size)):
        if value < 1:
            raise ParallelConfigError(f"{name} must be >= 1, got {value}")
    if pp_size > config.num_layers:
        raise ParallelConfigError(
            f"pp_size {pp_size} is more than the model's {config.num_layers} layers"
        )
    if tp_size > 1 and ep_size > 1 and tp_size != ep_size:
        raise ParallelConfigError(
            f"tp_size {tp_size} and ep_size {ep_size} must be equal when both are > 1 "
            "(experts are spread over the same ranks as the heads)"
        )
    if ep_size > 1:
        if config.moe is None:
            raise ParallelConfigError(f"ep_size {ep_size} needs a mixture-of-experts model")
        if config.moe.n_routed_experts % ep_size:
            raise ParallelConfigError(
                f"n_routed_experts {config.moe.n_routed_experts} is not a multiple of "
                f"ep_size {ep_size}"
            )
    if tp_size > 1:
        heads, kv = config.num_heads, config.num_kv_heads
        if heads % tp_size:
            raise ParallelConfigError(
                f"num_attention_heads {heads} is not a multiple of tp_size {tp_size}"
            )
        if kv % tp_size and tp_size % kv:
            raise ParallelConfigError(
                f"num_key_value_heads {kv} and tp_size {tp_size}: one must divide the other"
            )
        if config.moe and config.moe.n_routed_experts % tp_size:
            raise ParallelConfigError(
                f"n_routed_experts {config.moe.n_routed_experts} is not a multiple of "
                f"tp_size {tp_size} (tensor parallel ranks split the experts)"
            )
        if config.intermediate_size % tp_size:
            raise ParallelConfigError(
                f"intermediate_size {config.intermediate_size} is not a multiple of "
                f"tp_size {tp_size}"
            )


def heads_of(config: ModelConfig, shard: Shard) -> tuple[int, int, int, int]:
    """(first query head, query heads, first KV head, KV heads) of this rank."""
    n, r = shard.tp_size, shard.tp_rank
    q = config.num_heads // n
    if config.num_kv_heads % n == 0:
        kv = config.num_kv_heads // n
        return r * q, q, r * kv, kv
    group = config.num_heads // config.num_kv_heads  # replicated: the KV head of my queries
    return r * q, q, (r * q) // group, 1


def vocab_rows(vocab: int, shard: Shard) -> tuple[int, int, int]:
    """(first row, rows held, rows per rank after padding) of the vocabulary."""
    per = -(-vocab // shard.tp_size)
    start = min(shard.tp_rank * per, vocab)
    return start, min(per, vocab - start), per


def local_config(config: ModelConfig, shard: Shard) -> ModelConfig:
    """The config a rank's KV pool is sized by: its layers and its KV heads."""
    layers = len(shard.layers(config.num_layers))
    _, _, _, kv = heads_of(config, shard) if shard.tp_size > 1 else (0, 0, 0, config.num_kv_heads)
    kinds = config.layer_types[shard.layers(config.num_layers).start :][:layers]
    return dataclasses.replace(config, num_layers=layers, num_kv_heads=kv, layer_types=kinds)


def expert_block(n_experts: int, shard: Shard) -> range:
    per = n_experts // shard.ep_size
    return range(shard.ep_rank * per, (shard.ep_rank + 1) * per)
