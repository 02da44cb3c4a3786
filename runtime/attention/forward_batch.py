"""What one forward pass computes: decode tokens first, then extend (prefill) chunks."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(slots=True)
class ForwardBatch:
    """Tokens of one step, flattened: the decode requests' single tokens, then each extend chunk.

    Invariants: `input_ids`, `positions` and `out_slots` have length
    `num_decode + sum(extend_lens)`; `out_slots[i]` is the flat pool slot
    (`page * page_size + offset`) where token i's K/V is written before attention reads it;
    `logit_rows` indexes the tokens whose next-token logits are wanted, in output order.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_slots: torch.Tensor  # [T] int64
    num_decode: int
    decode_page_table: torch.Tensor  # [num_decode, max_pages] int32
    decode_seq_lens: torch.Tensor  # [num_decode] int32, counting the new token
    extend_page_table: torch.Tensor  # [num_extend, max_pages] int32
    extend_prefix_lens: torch.Tensor  # [num_extend] int32
    extend_lens: torch.Tensor  # [num_extend] int32
    logit_rows: torch.Tensor  # [N] int64

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device) -> ForwardBatch:
        """The same batch with every tensor on `device` (a GPU engine copies each step's
        host-built batch over; copies from pinned memory do not wait for the host)."""
        return ForwardBatch(
            **{
                f.name: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
                for f in fields(self)
                for v in (getattr(self, f.name),)
            }
        )
