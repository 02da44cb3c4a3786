"""A draft model (SGLang's STANDALONE): a smaller or quantized model with the target's
vocabulary proposes each request's next tokens greedily.

The draft keeps its KV in a pool of its own (same page size as the target's), per request a
list of pages and the tokens whose KV they hold. A round of drafting for a batch of requests is
one extend (each request's tokens that the draft has not computed yet: after a verify, the
accepted drafts' successor and whatever the draft got wrong; at first, the prompt) giving the
first draft, then one batched decode per further draft. Positions the target rejects are
dropped from the request's draft tokens before the next round (their KV is overwritten; pages
past the kept tokens go back to the draft's free list), so nothing rejected is reused. The
draft's KV never reaches the target's pool or its radix cache. When a request finishes or is
preempted (`release`) its draft KV is kept among the last few, for a request that starts with
the same tokens (a prompt run again, a conversation's next turn, the request itself resumed),
and freed when older ones or pages are needed.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.memory.kv_pool import KVPool
from runtime.speculative.config import SpeculativeConfigError

logger = logging.getLogger(__name__)

RETIRED = 8  # finished requests whose draft KV is kept for a request with the same head
MAX_CATCH_UP = 1024  # tokens of one request the draft computes in one round, at most
DECODE_ROWS = 16  # a round's catch-up of at most this many tokens runs as decode rows


@dataclass(slots=True)
class DraftSeq:
    """One request's draft KV: `tokens[i]`'s K/V is at position i in `pages`."""

    pages: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def check_vocabulary(draft_tok: Any, draft_vocab: int, target_tok: Any, target_vocab: int,
                     path: str) -> None:  # fmt: skip
    """A SpeculativeConfigError naming speculative_draft_model_path unless the draft's
    vocabulary (size and token strings) is the target's."""
    problem = None
    if draft_vocab != target_vocab:
        problem = f"{draft_vocab} logits against the target's {target_vocab}"
    else:
        get_d, get_t = getattr(draft_tok, "get_vocab", None), getattr(target_tok, "get_vocab", None)
        if get_d is not None and get_t is not None and get_d() != get_t():
            problem = "its tokenizer's vocabulary differs from the target's"
    if problem is not None:
        raise SpeculativeConfigError(
            f"speculative_draft_model_path {path!r}: the draft model must share the target's "
            f"vocabulary ({problem})"
        )


class DraftModel:
    """The draft model, its own KV pool and every request's draft state (scheduler thread
    only). `propose` drafts for a batch of requests at once."""

    def __init__(self, model: Any, pool: KVPool, device: torch.device | None = None) -> None:
        self.model = model
        self.pool = pool
        self.page_size = pool.page_size
        self.device = device or torch.device("cpu")
        self.seqs: dict[int, DraftSeq] = {}  # id(request) -> its draft KV
        # finished or preempted requests' draft KV, oldest first (taken over by prefix)
        self.retired: OrderedDict[int, DraftSeq] = OrderedDict()
        self._retired_ct = 0
        self.forwards = 0  # draft forward passes run (stats, tests)
        self.computed = 0  # tokens the draft computed to catch up with its requests
        # the last round's forwards of decode size (a long catch-up left out) and their seconds
        self.step_forwards, self.step_s = 0, 0.0
        self.clock = time.perf_counter  # the scheduler's step clock (Speculator.bind_clock)

    @classmethod
    def load(cls, path: str | Path, *, target_tokenizer: Any, target_vocab: int,
             dtype: torch.dtype, device: torch.device, attention_backend: str, num_pages: int,
             page_size: int) -> DraftModel:  # fmt: skip
        """The model at `path` (a folder or a GGUF file, as the engine loads its own) on
        `device`, with a pool of `num_pages` pages."""
        from runtime.attention import make_backend
        from runtime.device import building_on, place_state
        from runtime.models.loader import load_model_files
        from runtime.models.registry import model_class

        try:
            loaded = load_model_files(path)
        except Exception as exc:  # the path or its files: a config error naming the option
            raise SpeculativeConfigError(
                f"speculative_draft_model_path {str(path)!r}: {exc}"
            ) from exc
        check_vocabulary(loaded.tokenizer, loaded.config.vocab_size, target_tokenizer,
                         target_vocab, str(path))  # fmt: skip
        state = place_state(loaded.state_dict, device)
        with building_on(device):
            model = model_class(loaded.config)(
                loaded.config, state, dtype, attention=make_backend(attention_backend)
            )
        pool = KVPool(loaded.config, num_pages, page_size, dtype, device=device)
        logger.info("draft model %s: %.1f MiB of weights, %d KV pages", path,
                    model.weight_bytes() / 2**20, num_pages)  # fmt: skip
        return cls(model, pool, device)

    # ---- per request -----------------------------------------------------------------------
    def release(self, key: int) -> None:
        """The request `key` (its id) ended or left the batch: its draft KV is kept among the
        last RETIRED ones (a request starting with the same tokens, or this one resumed after
        a preemption, takes it over), the oldest freed beyond them."""
        st = self.seqs.pop(key, None)
        if st is None:
            return
        if st.tokens:
            self._retired_ct += 1
            self.retired[self._retired_ct] = st
        elif st.pages:
            self.pool.free(st.pages)
        while len(self.retired) > RETIRED:
            self._free_oldest()

    def _free_oldest(self) -> bool:
        if not self.retired:
            return False
        _, st = self.retired.popitem(last=False)
        self.pool.free(st.pages)
        return True

    def _adopt(self, seq: list[int]) -> DraftSeq:
        """A new request's draft state: the retired one sharing the longest head with `seq`
        (at least a page), else an empty one."""
        best, best_len = None, self.page_size - 1
        for rid, st in self.retired.items():
            n = common_prefix(st.tokens, seq)
            if n > best_len:
                best, best_len = rid, n
        return self.retired.pop(best) if best is not None else DraftSeq()

    @property
    def retired_pages(self) -> int:
        return sum(len(st.pages) for st in self.retired.values())

    def _fit(self, st: DraftSeq, upto: int) -> bool:
        """Pages for positions < `upto` (allocated, or freed past it); False: pool full."""
        need = -(-upto // self.page_size)
        if need > len(st.pages):
            got = self.pool.alloc(need - len(st.pages))
            while got is None and self._free_oldest():  # retired KV makes room first
                got = self.pool.alloc(need - len(st.pages))
            if got is None:
                return False
            st.pages.extend(got)
        elif need < len(st.pages):
            self.pool.free(st.pages[need:])
            del st.pages[need:]
        return True

    # ---- a round of drafting -----------------------------------------------------------------
    def propose(self, items: list[tuple[int, list[int], int]]) -> tuple[list[list[int]], float]:
        """`items`: (request id, its tokens, drafts wanted). Returns each one's greedy drafts
        (fewer, or none, when its draft pool is full or its catch-up is longer than
        MAX_CATCH_UP tokens) and the seconds the draft forwards took."""
        start = self.clock()
        self.step_forwards, self.step_s = 0, 0.0
        out: list[list[int]] = [[] for _ in items]
        spans = []  # (index, st, first position, tokens to compute, drafts wanted)
        for i, (key, seq, k) in enumerate(items):
            st = self.seqs.get(key)
            if st is None:
                st = self.seqs[key] = self._adopt(seq)
            keep = min(common_prefix(st.tokens, seq), len(seq) - 1)  # the last one's logits
            del st.tokens[keep:]
            todo = seq[keep:]
            if len(todo) > MAX_CATCH_UP:  # a long prompt: computed over several rounds
                todo, k = todo[:MAX_CATCH_UP], 0
            if not self._fit(st, keep + len(todo) + max(k - 1, 0)):
                self._fit(st, keep)
                continue
            spans.append((i, st, keep, todo, k))
            self.computed += len(todo)
        if not spans:
            return out, self.clock() - start
        logits = self._forward_extend(spans)
        first = logits.argmax(dim=-1).tolist()
        live = []  # (index, st, position of its last draft, drafts wanted)
        for (i, st, _, todo, k), tok in zip(spans, first, strict=True):
            st.tokens.extend(todo)
            if k > 0:
                out[i].append(tok)
                if k > 1:
                    live.append((i, st, k))
        step = 1
        while live:
            logits = self._forward_decode([(st, out[i][-1]) for i, st, _ in live])
            toks = logits.argmax(dim=-1).tolist()
            for (i, st, _), tok in zip(live, toks, strict=True):
                st.tokens.append(out[i][-1])
                out[i].append(tok)
            step += 1
            live = [entry for entry in live if entry[2] > step]
        return out, self.clock() - start

    def _page_table(self, seqs: list[DraftSeq]) -> torch.Tensor:
        width = max(len(s.pages) for s in seqs)
        rows = [s.pages + [0] * (width - len(s.pages)) for s in seqs]
        return torch.tensor(rows, dtype=torch.int32).reshape(len(seqs), width)

    def _slots(self, st: DraftSeq, lo: int, hi: int) -> list[int]:
        ps = self.page_size
        return [st.pages[p // ps] * ps + p % ps for p in range(lo, hi)]

    def _run(self, batch: ForwardBatch) -> torch.Tensor:
        start = self.clock()
        if self.device.type != "cpu":
            batch = batch.to(self.device)
        self.forwards += 1
        with torch.inference_mode():
            out = self.model.forward(batch, self.pool).float().cpu()
        if batch.num_decode == batch.num_tokens:
            self.step_forwards += 1
            self.step_s += self.clock() - start
        return out

    def _forward_extend(self, spans: list) -> torch.Tensor:
        if sum(len(s[3]) for s in spans) <= DECODE_ROWS:
            return self._forward_rows(spans)
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        rows: list[int] = []
        for _, st, keep, todo, _ in spans:
            ids.extend(todo)
            positions.extend(range(keep, keep + len(todo)))
            slots.extend(self._slots(st, keep, keep + len(todo)))
            rows.append(len(ids) - 1)
        seqs = [s[1] for s in spans]
        return self._run(ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            out_slots=torch.tensor(slots, dtype=torch.long),
            num_decode=0,
            decode_page_table=torch.zeros((0, 1), dtype=torch.int32),
            decode_seq_lens=torch.zeros(0, dtype=torch.int32),
            extend_page_table=self._page_table(seqs),
            extend_prefix_lens=torch.tensor([s[2] for s in spans], dtype=torch.int32),
            extend_lens=torch.tensor([len(s[3]) for s in spans], dtype=torch.int32),
            logit_rows=torch.tensor(rows, dtype=torch.long),
        ))  # fmt: skip

    def _forward_rows(self, spans: list) -> torch.Tensor:
        """A short catch-up as decode rows, one per token (each attends up to its own position,
        which the rows before it write in this forward): the model's decode path."""
        ids: list[int] = []
        positions: list[int] = []
        seqs: list[DraftSeq] = []
        rows: list[int] = []
        for _, st, keep, todo, _ in spans:
            ids.extend(todo)
            positions.extend(range(keep, keep + len(todo)))
            seqs.extend([st] * len(todo))
            rows.append(len(ids) - 1)
        return self._decode_rows(ids, positions, seqs, torch.tensor(rows, dtype=torch.long))

    def _forward_decode(self, entries: list[tuple[DraftSeq, int]]) -> torch.Tensor:
        seqs = [st for st, _ in entries]
        pos = [len(st.tokens) for st in seqs]
        ids = [tok for _, tok in entries]
        return self._decode_rows(ids, pos, seqs, torch.arange(len(entries), dtype=torch.long))

    def _decode_rows(
        self, ids: list[int], positions: list[int], seqs: list[DraftSeq], rows: torch.Tensor
    ) -> torch.Tensor:
        """One forward of decode rows: token `ids[i]` of `seqs[i]` at `positions[i]`; the
        logits of `rows`."""
        slots = [self._slots(st, p, p + 1)[0] for st, p in zip(seqs, positions, strict=True)]
        return self._run(ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            out_slots=torch.tensor(slots, dtype=torch.long),
            num_decode=len(ids),
            decode_page_table=self._page_table(seqs),
            decode_seq_lens=torch.tensor([p + 1 for p in positions], dtype=torch.int32),
            extend_page_table=torch.zeros((0, 1), dtype=torch.int32),
            extend_prefix_lens=torch.zeros(0, dtype=torch.int32),
            extend_lens=torch.zeros(0, dtype=torch.int32),
            logit_rows=rows,
        ))  # fmt: skip
