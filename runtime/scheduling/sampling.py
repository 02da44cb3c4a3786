"""Turning a batch of logits rows into next tokens, one request per row.

Every transform is vectorised over the rows that need it; a batch of greedy requests without
penalties is a single argmax. Log-probs are the log-softmax of the logits after the logit bias,
the repetition / frequency / presence penalties and the grammar mask, before temperature and
top-k/p/min-p. The logit bias is added here, after the grammar mask has set the tokens it
forbids to -inf: a finite bias leaves them at -inf, so the result is OpenAI's "bias, then mask".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from runtime.kernels.cpu import fused as cpu_fused
from runtime.scheduling.request import Request


@dataclass(slots=True)
class SampleOutput:
    tokens: list[int]
    logprobs: list[float | None]
    top_logprobs: list[dict[int, float] | None]


def _apply_penalties(row: torch.Tensor, req: Request) -> None:
    p = req.params
    if p.repetition_penalty != 1.0:
        # as transformers: every token seen in prompt or output, divided if positive
        seen = torch.tensor(sorted(set(req.seq)), dtype=torch.long, device=row.device)
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and req.output_ids:
        # OpenAI semantics: over the generated tokens only
        out = torch.tensor(req.output_ids, dtype=torch.long, device=row.device)
        counts = torch.bincount(out, minlength=row.shape[0])[: row.shape[0]].to(row.dtype)
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)


def _apply_logit_bias(logits: torch.Tensor, reqs: Sequence[Request]) -> None:
    """Add each request's `logit_bias` to its row (ids past the logits' width are ignored)."""
    width = logits.shape[1]
    for i, req in enumerate(reqs):
        bias = req.params.logit_bias
        if bias:
            ids = torch.tensor([t for t in bias if t < width], dtype=torch.long,
                               device=logits.device)  # fmt: skip
            vals = torch.tensor([v for t, v in bias.items() if t < width], dtype=logits.dtype,
                                device=logits.device)  # fmt: skip
            logits[i].index_add_(0, ids, vals)


def _forbid_end(
    logits: torch.Tensor, rows: list[int], stop_ids: frozenset[int], eos_ids: Sequence[int]
) -> None:
    """Before min_new_tokens, EOS and stop ids may not be sampled (in these rows)."""
    banned = sorted({t for t in (*eos_ids, *stop_ids) if t < logits.shape[1]})
    if banned:
        dev = logits.device
        rows_t, banned_t = torch.tensor(rows, device=dev), torch.tensor(banned, device=dev)
        logits[rows_t[:, None], banned_t[None, :]] = float("-inf")


def _truncate(logits: torch.Tensor, reqs: Sequence[Request]) -> torch.Tensor:
    """top-k, top-p and min-p on temperature-scaled logits [N, V]; returns the new logits."""
    dev = logits.device
    top_k = [r.params.top_k for r in reqs]
    top_p = [r.params.top_p for r in reqs]
    min_p = [r.params.min_p for r in reqs]
    if any(p > 0 for p in min_p):
        probs = torch.softmax(logits, dim=-1)
        floor = probs.max(dim=-1, keepdim=True).values * torch.tensor(min_p, device=dev)[:, None]
        logits = logits.masked_fill(probs < floor, float("-inf"))
    if all(k == -1 for k in top_k) and all(p >= 1.0 for p in top_p):
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    vocab = logits.shape[1]
    ranks = torch.arange(vocab, device=dev)[None, :]
    ks = torch.tensor([k if k > 0 else vocab for k in top_k], device=dev)[:, None]
    drop = ranks >= ks
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    # keep the smallest head whose mass reaches top_p (the token crossing it included)
    before = probs.cumsum(dim=-1) - probs
    drop |= before >= torch.tensor(top_p, device=dev)[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


_ARGMAX_CHUNK = 1024


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """`logits.argmax(-1)` for [N, V] (the first index of each row's maximum), ~6x faster on CPU:
    torch's argmax over a long row is a scalar loop, its max-reduction is vectorised. So: the
    maximum of each 1024-wide chunk, the first chunk holding the row's maximum, then the
    argmax inside that chunk alone (and the ragged tail beside it). One CPU row: a C loop
    (cpu_fused.argmax_row), which opens no OpenMP region."""
    n, v = logits.shape
    one_cpu_row = n == 1 and logits.dtype == torch.float32 and not logits.is_cuda
    if one_cpu_row and v and cpu_fused.available(torch.float32):
        return cpu_fused.argmax_row(logits)
    k = v // _ARGMAX_CHUNK
    if k < 4 or not logits.is_contiguous() or logits.is_cuda:
        return logits.argmax(dim=-1)
    head = logits[:, : k * _ARGMAX_CHUNK].view(n, k, _ARGMAX_CHUNK)
    chunk_max = head.amax(dim=-1)  # [N, k]
    best = chunk_max.argmax(dim=-1)  # the first chunk holding the maximum
    tokens = best * _ARGMAX_CHUNK + head[torch.arange(n), best].argmax(dim=-1)
    if v % _ARGMAX_CHUNK:  # the tail wins only if strictly larger (first occurrence)
        tail_max, tail_arg = logits[:, k * _ARGMAX_CHUNK :].max(dim=-1)
        later = tail_max > chunk_max.gather(1, best[:, None])[:, 0]
        tokens = torch.where(later, tail_arg + k * _ARGMAX_CHUNK, tokens)
    return tokens


def adjust_logits(logits: torch.Tensor, reqs: Sequence[Request], eos_ids: Sequence[int]) -> None:
    """The logit bias, the penalties and the min_new_tokens ban on end tokens, in place on
    `logits` [N, V] (row i is reqs[i]): the logits whose log-softmax is reported."""
    _apply_logit_bias(logits, reqs)
    forbid: dict[frozenset[int], list[int]] = {}  # rows before min_new_tokens, by stop ids
    for i, req in enumerate(reqs):
        if req.params.has_penalties:
            _apply_penalties(logits[i], req)
        if len(req.output_ids) < req.params.min_new_tokens:
            forbid.setdefault(req.params.stop_token_ids, []).append(i)
    for stop_ids, rows in forbid.items():  # one masked write per group, not one per row
        _forbid_end(logits, rows, stop_ids, eos_ids)


def sampling_probs(logits: torch.Tensor, reqs: Sequence[Request]) -> torch.Tensor:
    """The distribution a non-greedy request samples from, on the host: `logits` (adjusted)
    scaled by temperature, cut by top-k / top-p / min-p, softmaxed."""
    temps = torch.tensor([r.params.temperature for r in reqs], device=logits.device)
    return torch.softmax(_truncate(logits / temps[:, None], reqs), dim=-1).cpu()


def sample(
    logits: torch.Tensor,
    reqs: Sequence[Request],
    eos_ids: Sequence[int],
    global_generator: torch.Generator,
) -> SampleOutput:
    """Next token for each row of `logits` [N, V] (float32, modified in place)."""
    n = len(reqs)
    adjust_logits(logits, reqs, eos_ids)
    want_lp = [i for i, r in enumerate(reqs) if r.params.logprobs or r.params.top_logprobs]
    logprob_rows = torch.log_softmax(logits[want_lp], dim=-1) if want_lp else None

    tokens = torch.empty(n, dtype=torch.long, device=logits.device)
    greedy = [i for i, r in enumerate(reqs) if r.params.is_greedy]
    if len(greedy) == n:
        tokens = greedy_tokens(logits)
    elif greedy:
        tokens[greedy] = greedy_tokens(logits[greedy])
    sampled = [i for i, r in enumerate(reqs) if not r.params.is_greedy]
    if sampled:
        sub_reqs = [reqs[i] for i in sampled]
        # the draws take the host's generators (the engine's, or a request's seeded one), so
        # a seed means one sequence of draws on any device: a GPU's probabilities come over
        probs = sampling_probs(logits[sampled], sub_reqs)
        unseeded = [j for j, r in enumerate(sub_reqs) if r.generator is None]
        if unseeded:
            picks = torch.multinomial(probs[unseeded], 1, generator=global_generator)[:, 0]
            tokens[[sampled[j] for j in unseeded]] = picks.to(tokens.device)
        for j, r in enumerate(sub_reqs):
            if r.generator is not None:
                tokens[sampled[j]] = torch.multinomial(probs[j], 1, generator=r.generator)[0].item()

    token_list = tokens.tolist()
    lps: list[float | None] = [None] * n
    tops: list[dict[int, float] | None] = [None] * n
    if logprob_rows is not None:
        chosen = logprob_rows.gather(1, tokens[want_lp][:, None])[:, 0].tolist()
        kmax = max(reqs[i].params.top_logprobs for i in want_lp)
        top_vals = top_ids = None
        if kmax:
            top_vals, top_ids = logprob_rows.topk(kmax, dim=-1)
        for j, i in enumerate(want_lp):
            lps[i] = chosen[j]
            k = reqs[i].params.top_logprobs
            if k and top_vals is not None and top_ids is not None:
                tops[i] = dict(zip(top_ids[j, :k].tolist(), top_vals[j, :k].tolist(), strict=True))
    return SampleOutput(token_list, lps, tops)
