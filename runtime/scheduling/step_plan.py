"""One scheduler step's plan (who decodes, who extends by how much) and its ForwardBatch."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from runtime.attention.forward_batch import ForwardBatch
from runtime.scheduling.request import Request


@dataclass(slots=True)
class ExtendItem:
    req: Request
    start: int  # first position computed in this step (== req.computed before the step)
    length: int  # tokens computed in this step

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(slots=True)
class VerifyItem:
    """Speculative decoding: the request's uncomputed tokens (`seq[start:]`, its last sampled
    token and any jump-forward text) and then `drafts`, computed in one extend; the logits of
    the last real token and of every draft (len(drafts) + 1 rows) decide which drafts hold."""

    req: Request
    start: int  # == req.computed before the step
    drafts: list[int]


@dataclass(slots=True)
class StepPlan:
    decodes: list[Request] = field(default_factory=list)
    extends: list[ExtendItem] = field(default_factory=list)
    verifies: list[VerifyItem] = field(default_factory=list)
    # filled by build_batch: per request, the logits rows it owns in the model output
    sample_rows: list[tuple[Request, int]] = field(default_factory=list)
    score_rows: list[tuple[Request, int, int]] = field(default_factory=list)  # req, row0, count
    verify_rows: list[tuple[VerifyItem, int]] = field(default_factory=list)  # item, row0
    # built ahead of the previous step's sampling (overlap.py): input rows whose token is not
    # sampled yet, with their request; the token goes in once it is
    pending_inputs: list[tuple[int, Request]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.extends or self.verifies)


VERIFY_DECODE_ROWS = 16  # verifies of at most this many tokens run as decode rows (--verify-ab,
# one thread: 2-16 rows 0.5-0.8 of an extend's time, once one request's rows stopped forming a
# cascade group, which had turned the one-call decode path off from 5 rows at 512 tokens)


def _verify_rows(item: VerifyItem) -> int:
    return item.req.seq_len - item.start + len(item.drafts)


def _page_table(reqs: list[Request], width: int) -> torch.Tensor:
    rows = [r.pages + [0] * (width - len(r.pages)) for r in reqs]
    return torch.tensor(rows, dtype=torch.int32).reshape(len(reqs), width)


def build_batch(plan: StepPlan, page_size: int, ahead: bool = False) -> ForwardBatch:
    """Flatten the plan into tensors; records in `plan` which logits rows belong to whom.

    `ahead`: a decode whose input token is not sampled yet gets a placeholder, listed in
    `plan.pending_inputs`."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    logit_rows: list[int] = []
    plan.sample_rows.clear()
    plan.score_rows.clear()
    plan.verify_rows.clear()
    plan.pending_inputs.clear()
    for req in plan.decodes:
        pos = req.computed
        n_prompt = len(req.prompt_ids)
        if ahead and pos - n_prompt == len(req.output_ids):
            plan.pending_inputs.append((len(ids), req))
            ids.append(0)  # placeholder
        else:
            ids.append(req.prompt_ids[pos] if pos < n_prompt else req.output_ids[pos - n_prompt])
        positions.append(pos)
        slots.append(req.pages[pos // page_size] * page_size + pos % page_size)
        plan.sample_rows.append((req, len(logit_rows)))
        logit_rows.append(len(ids) - 1)
    # short verifies (the usual case) as decode rows, one per token: row i attends to the
    # request's pages up to its own position, which the rows before it write in this same
    # forward, so it computes what decoding that token would (and a decode-only step keeps
    # the model's decode path)
    row_decodes = [v for v in plan.verifies if _verify_rows(v) <= VERIFY_DECODE_ROWS]
    decode_reqs = list(plan.decodes)
    seq_lens = [r.computed + 1 for r in plan.decodes]
    for item in row_decodes:
        req, base = item.req, len(ids)
        end = req.seq_len + len(item.drafts)
        ids.extend(req.seq[item.start :] + item.drafts)
        # every decode row has a logits row (a decode step's logits are all its rows: the
        # graph runner's replays return them so); the verify reads from its last real token's
        plan.verify_rows.append((item, len(logit_rows) + req.seq_len - 1 - item.start))
        for pos in range(item.start, end):
            positions.append(pos)
            slots.append(req.pages[pos // page_size] * page_size + pos % page_size)
            decode_reqs.append(req)
            seq_lens.append(pos + 1)
        logit_rows.extend(range(base, len(ids)))
    num_decode = len(ids)
    for item in plan.extends:
        req, base = item.req, len(ids)
        seq = req.seq
        ids.extend(seq[item.start : item.end])
        pos = torch.arange(item.start, item.end)
        pages = torch.tensor(req.pages, dtype=torch.long)
        positions.extend(range(item.start, item.end))
        slots.extend((pages[pos // page_size] * page_size + pos % page_size).tolist())
        if req.logprob_start is not None:
            # the logits at position p score token p + 1
            lo = max(item.start, req.logprob_start - 1)
            hi = min(item.end, req.seq_len - 1)
            if hi > lo:
                plan.score_rows.append((req, len(logit_rows), hi - lo))
                logit_rows.extend(range(base + lo - item.start, base + hi - item.start))
        if item.end == req.seq_len and len(req.output_ids) < req.params.max_new_tokens:
            plan.sample_rows.append((req, len(logit_rows)))
            logit_rows.append(len(ids) - 1)
    spans = [(i.req, i.start, i.length) for i in plan.extends]
    for item in plan.verifies:  # extends too: the real tokens, then the drafts
        if item in row_decodes:
            continue
        req = item.req
        ids.extend(req.seq[item.start :] + item.drafts)
        end = req.seq_len + len(item.drafts)
        pos = torch.arange(item.start, end)
        pages = torch.tensor(req.pages, dtype=torch.long)
        positions.extend(range(item.start, end))
        slots.extend((pages[pos // page_size] * page_size + pos % page_size).tolist())
        plan.verify_rows.append((item, len(logit_rows)))
        last = len(ids) - 1
        logit_rows.extend(range(last - len(item.drafts), last + 1))
        spans.append((req, item.start, end - item.start))
    width = max([len(r.pages) for r in decode_reqs] + [len(s[0].pages) for s in spans])
    ext_reqs = [s[0] for s in spans]
    return ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.long),
        positions=torch.tensor(positions, dtype=torch.long),
        out_slots=torch.tensor(slots, dtype=torch.long),
        num_decode=num_decode,
        decode_page_table=_page_table(decode_reqs, width),
        decode_seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        extend_page_table=_page_table(ext_reqs, width),
        extend_prefix_lens=torch.tensor([s[1] for s in spans], dtype=torch.int32),
        extend_lens=torch.tensor([s[2] for s in spans], dtype=torch.int32),
        logit_rows=torch.tensor(logit_rows, dtype=torch.long),
    )
