"""The scheduler's speculative decoding hook: drafts for a request (proposed, then cut where
its grammar refuses them), their verification, the draft length each request earns, and the
per-request numbers users see."""

from __future__ import annotations

import logging

import torch

from runtime.scheduling.request import Request
from runtime.scheduling.step_plan import VerifyItem
from runtime.scheduling.step_results import OutputContext, StepResult
from runtime.speculative.config import SpeculativeConfig
from runtime.speculative.ngram import NgramProposer
from runtime.speculative.verify import accept_chain

logger = logging.getLogger(__name__)

MAX_BACKOFF = 16  # decode steps without drafts, at most, after a verify that kept none


class Speculator:
    """One per engine (scheduler thread only). Per request it keeps, on the request's
    `SpecState`: the draft length (grows by 2 after a verify that kept every draft, falls to
    one more than were kept otherwise) and a back-off (after a verify that kept nothing, the
    next 1, 2, 4, ... 16 decode steps draft nothing: text with little to copy decodes as
    without speculation)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        self.max_batch = config.disable_by_batch_size
        self.proposer = NgramProposer(
            config.ngram_min_match_window_size, config.ngram_max_match_window_size
        )

    def drafts(self, req: Request, limit: int) -> list[int]:
        st = req.spec
        if st.skip > 0:
            st.skip -= 1
            return []
        k = min(limit, st.draft_len or self.config.num_draft_tokens)
        drafts = self.proposer.propose(req.seq, k)
        if drafts and req.constraint is not None:
            drafts = grammar_prefix(req.constraint, drafts)
        return drafts

    def accept(
        self, ctx: OutputContext, item: VerifyItem, logits: torch.Tensor, result: StepResult
    ) -> None:
        accepted, appended = accept_chain(ctx, item, logits, result)
        st = item.req.spec
        st.verify_ct += 1
        st.accepted += accepted
        st.verify_tokens += appended
        proposed = len(item.drafts)
        cap = self.config.num_draft_tokens
        if accepted == proposed:
            st.draft_len = min(cap, (st.draft_len or cap) + 2)
        else:
            st.draft_len = max(1, accepted + 1)
        if accepted == 0:
            st.misses = min(MAX_BACKOFF, max(1, 2 * st.misses))
            st.skip = st.misses
        else:
            st.misses = 0
        result.counts["spec_verify_steps"] += 1
        result.counts["spec_draft_tokens"] += proposed
        result.counts["spec_accepted_tokens"] += accepted
        result.counts["spec_verify_tokens"] += appended


def grammar_prefix(constraint: object, drafts: list[int]) -> list[int]:
    """The longest head of `drafts` that the request's matcher allows, walked on a copy (the
    request's matcher itself advances only over accepted tokens). The chain also ends after a
    draft that completes the match or after which the grammar forces text (jump-forward will
    append that text, which the next verify computes with its own drafts)."""
    matcher = getattr(constraint, "matcher", None)
    if matcher is None or not (hasattr(matcher, "copy") and hasattr(matcher, "is_allowed")):
        return []
    import grammar

    walk = matcher.copy()
    kept: list[int] = []
    for token in drafts:
        try:
            if not walk.is_allowed(token):
                break
            walk.advance(token)
        except grammar.GrammarError:
            break
        kept.append(token)
        if walk.is_dead() or (getattr(constraint, "jump_forward", False) and walk.forced_bytes()):
            break
    return kept
