"""Which drafts the target model confirms, token by token, exactly as decoding would.

Row i of a verify step's logits is the target's distribution after the request's tokens and
the first i drafts. Walking the rows in order, each row gets what a decode step's row gets (the
grammar mask of the matcher as it stands, the logit bias, penalties over the output so far,
min_new_tokens) and chooses a token:

- greedy: the argmax; draft i + 1 holds when it equals it;
- sampling: an n-gram draft is a point mass q = 1{x = d}, so the standard rule keeps the
  target distribution p: accept d with probability min(1, p(d) / q(d)) = p(d), else draw from
  the residual max(0, p - q) / Z, which is p with d removed and renormalised. Then
  P(d) = p(d) and P(x != d) = (1 - p(d)) p(x) / (1 - p(d)) = p(x).

The chosen token is appended and goes through `after_new_token` (the matcher advances over it,
stop strings, EOS, max_tokens, jump-forward, streaming) as a decoded token does. The walk ends
at the first token that differs from its draft (that token is the step's last: its KV is not
computed yet), at a finished request, or when jump-forward rewrote the output (the drafts no
longer follow it). A confirmed draft's KV, computed in the verify forward, is kept
(`req.computed` moves past it); the KV of the rejected positions is never counted as computed,
so it is overwritten later and never reaches the radix cache.
"""

from __future__ import annotations

import torch

from runtime.scheduling.request import Request
from runtime.scheduling.sampling import adjust_logits, greedy_tokens, sampling_probs
from runtime.scheduling.step_plan import VerifyItem
from runtime.scheduling.step_results import OutputContext, StepResult, after_new_token


def choose_token(
    row: torch.Tensor, req: Request, draft: int | None, generator: torch.Generator
) -> int:
    """The token row [1, V] (adjusted, masked) gives: `draft` when the rule above keeps it."""
    if req.params.is_greedy:
        return int(greedy_tokens(row)[0])
    probs = sampling_probs(row, [req])[0]
    gen = req.generator if req.generator is not None else generator
    if draft is not None:
        if torch.rand((), generator=gen).item() < float(probs[draft]):
            return draft
        probs[draft] = 0.0
        if not float(probs.sum()) > 0.0:  # p was a point mass on the draft: kept above
            return draft
    return int(torch.multinomial(probs, 1, generator=gen)[0])


def _record_logprobs(req: Request, row: torch.Tensor, token: int) -> None:
    if req.logprobs is None and req.top_logprobs is None:
        return
    lp = torch.log_softmax(row[0], dim=-1)
    if req.logprobs is not None:
        req.logprobs.append(float(lp[token]))
    if req.top_logprobs is not None:
        k = req.params.top_logprobs
        vals, ids = lp.topk(k) if k else (lp[:0], lp[:0].long())
        req.top_logprobs.append(dict(zip(ids.tolist(), vals.tolist(), strict=True)))


def accept_chain(
    ctx: OutputContext, item: VerifyItem, logits: torch.Tensor, result: StepResult
) -> tuple[int, int]:
    """Walk `logits` (len(item.drafts) + 1 rows) as above; returns (drafts accepted, tokens
    appended)."""
    req, drafts = item.req, item.drafts
    accepted = appended = 0
    for i in range(len(drafts) + 1):
        row = logits[i : i + 1]
        draft = drafts[i] if i < len(drafts) else None
        token = _greedy_allowed(ctx, req, row)
        if token is None:
            if ctx.hooks is not None and req.constraint is not None:
                if _masked_dead(ctx, req, row, result):
                    break
            adjust_logits(row, [req], ctx.detokenizer.eos_ids)
            token = choose_token(row, req, draft, ctx.generator)
            _record_logprobs(req, row, token)
        req.output_ids.append(token)
        appended += 1
        result.counts["generated_tokens"] += 1
        hit = token == draft
        if hit:  # its KV was computed with the right input: keep it
            req.computed += 1
            accepted += 1
        length, jumps = len(req.output_ids), _jumps(req)
        after_new_token(ctx, req, result)
        if result.finishing(req) or not hit:
            break
        if len(req.output_ids) != length or _jumps(req) != jumps:
            break  # jump-forward rewrote the output: the drafts no longer follow it
    if not result.finishing(req):
        ctx.book.cache_computed(req)
    return accepted, appended


def _masked_dead(ctx: OutputContext, req: Request, row: torch.Tensor, result: StepResult) -> bool:
    """Mask `row` by the request's grammar; True (the request aborted) when it allows no
    token (or the mask failed)."""
    if not ctx.hooks.mask_logits([req], row):
        return False
    if req.error is None:
        req.error = RuntimeError("the constraint allows no token here")
    result.finish(req, "abort")
    return True


def _greedy_allowed(ctx: OutputContext, req: Request, row: torch.Tensor) -> int | None:
    """A greedy constrained request that asked for no log-probs: the argmax of the adjusted,
    unmasked row when its grammar allows that token, without applying the vocabulary-wide mask
    (most of a verify row's work outside the forward). It is the masked row's argmax too: the
    mask only sets other tokens to -inf, and the logit bias, penalties and min_new_tokens ban
    act on each token alone (-inf stays -inf), so they commute with it; the first maximum of
    the whole row, allowed, is the first among the allowed. When the grammar refuses that
    token the row (already adjusted) is masked and its argmax taken here; None: any other
    request, or a mask that allows nothing or could not be read (the usual path aborts)."""
    st = req.constraint
    if (ctx.hooks is None or st is None or not req.params.is_greedy
            or req.logprobs is not None or req.top_logprobs is not None):  # fmt: skip
        return None
    import grammar

    try:
        bits = st.matcher.bitmask()
    except grammar.GrammarError:
        return None
    if not bits.any():
        return None  # no token allowed: the usual path aborts the request
    adjust_logits(row, [req], ctx.detokenizer.eos_ids)
    token = int(greedy_tokens(row)[0])
    if token < 32 * len(bits) and (int(bits[token >> 5]) >> (token & 31)) & 1:
        return token
    ctx.hooks.apply_token_bitmask_(row, torch.from_numpy(bits[None]), None)
    return int(greedy_tokens(row)[0])


def _jumps(req: Request) -> int:
    st = req.constraint
    return getattr(st, "jumps", 0) if st is not None else 0
