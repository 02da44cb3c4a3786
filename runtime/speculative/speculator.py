"""The scheduler's speculative decoding hook: drafts for a request (proposed, then cut where
its grammar refuses them), their verification, the draft length each request earns, and the
per-request numbers users see."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from runtime.scheduling.request import Request, SpecState
from runtime.scheduling.step_plan import StepPlan, VerifyItem
from runtime.scheduling.step_results import OutputContext, StepResult
from runtime.speculative.config import SpeculativeConfig
from runtime.speculative.draft_model import DraftModel
from runtime.speculative.ngram import NgramProposer
from runtime.speculative.policy import PRIOR_ACCEPT, StepCosts, acceptance
from runtime.speculative.verify import accept_chain

logger = logging.getLogger(__name__)

MAX_BACKOFF = 16  # decode steps without drafts, at most, after a verify that kept none
ACCEPT_DECAY = 0.8  # weight of a request's earlier verifies in its measured acceptance
ENGINE_DECAY = 0.95  # the same over every request's (the prior of a new request's)
SHADOW_EARLY = 3  # unverified drafts that came true, in a row, that resolve their shadow


class Speculator:
    """One per engine (scheduler thread only). Per step it proposes drafts for the decoding
    requests (n-gram lookup, `proposer`, or the STANDALONE draft model, `draft`), cut by each
    request's grammar, and `policy.StepCosts` caps them where verifying is expected to pay
    (`cost_aware`, the default), from the step costs `observe` measures and each request's
    per-draft acceptance (kept on its `SpecState`: its verified chains, and n-gram drafts it
    was offered but did not verify, checked against what it then decoded).

    With `cost_aware` off every proposal is verified, and the draft length adapts instead: it
    grows by 2 after a verify that kept every draft and falls to one more than were kept
    otherwise; after a verify that kept nothing the next 1, 2, 4, ... 16 steps draft nothing."""

    def __init__(self, config: SpeculativeConfig, draft: DraftModel | None = None) -> None:
        self.config = config
        self.max_batch = config.disable_by_batch_size
        self.proposer = NgramProposer(
            config.ngram_min_match_window_size, config.ngram_max_match_window_size
        )
        self.draft = draft
        self.costs = StepCosts()
        self.cost_aware = True
        self._draft_s = 0.0  # this step's drafting seconds (not the step's own cost)
        # every request's resolved chains, decayed: the prior of a request's acceptance
        self.accept_all = self.reject_all = 0.0
        self.clock: Callable[[], float] = time.perf_counter  # what `observe` is given

    def bind_clock(self, runner: object) -> None:
        """The clock step costs are measured in: on a CPU whose forwards run in this process,
        the scheduler thread's CPU time (`time.thread_time`: on a loaded machine the wall
        time of a step is mostly other processes' turn, which made 2-row verifies look as
        cheap as a decode step one run and twice as dear the next), else the wall time (a
        GPU, worker processes). The draft model measures its forwards alike."""
        device = getattr(runner, "device", None)
        local_cpu = getattr(device, "type", "cpu") == "cpu" and not getattr(
            runner, "is_parallel", False
        )
        self.clock = time.thread_time if local_cpu else time.perf_counter
        if self.draft is not None:
            self.draft.clock = self.clock

    # ---- the scheduler's calls -------------------------------------------------------------
    def propose(self, items: list[tuple[Request, int]], batch: int) -> list[list[int]]:
        """Drafts for each (request, most drafts it has room for); `batch`: the requests
        decoding this step."""
        self._draft_s = 0.0
        wanted = [self._wanted(req, limit) for req, limit in items]
        if self.draft is None:
            out = []
            for (req, _), k in zip(items, wanted, strict=True):
                if self.cost_aware:
                    self._shadow_check(req)
                    if req.spec.shadow:  # not verifying; no lookup until it is resolved
                        k = 0
                out.append(self._ngram(req, k) if k else [])
            # a request verifies drafts once one of its own chains was measured (unverified
            # drafts are: the other requests' acceptance says little about this one's text)
            measured = [not self.cost_aware or r.spec.accept_w + r.spec.reject_w > 0
                        for r, _ in items]  # fmt: skip
            lens = [len(d) if m else 0 for d, m in zip(out, measured, strict=True)]
            cap = self._cap(items, batch, lens, model=False)
            if self.cost_aware:  # what is not verified is checked against the output later
                for (req, _), d, m in zip(items, out, measured, strict=True):
                    if d and (cap == 0 or not m) and not req.spec.shadow:
                        req.spec.shadow, req.spec.shadow_at = d, req.seq_len
            return [d[:cap] if m else [] for d, m in zip(out, measured, strict=True)]
        cap = self._cap(items, batch, wanted, model=True)
        asks = [(id(req), req.seq, min(k, cap)) for (req, _), k in zip(items, wanted, strict=True)]
        asks = [a for a in asks if a[2] > 0]
        if not asks:
            return [[] for _ in items]
        drafted, self._draft_s = self.draft.propose(asks)
        # a draft forward's cost: the round's decode-sized forwards (a prompt's catch-up is
        # paid once, not per draft)
        self.costs.observe_draft(len(asks), self.draft.step_forwards, self.draft.step_s)
        by_req = {key: d for (key, _, _), d in zip(asks, drafted, strict=True)}
        out = []
        for req, _ in items:
            d = by_req.get(id(req), [])
            if d and req.constraint is not None:
                d = grammar_prefix(req.constraint, d)
            out.append(d)
        return out

    def _shadow_check(self, req: Request) -> None:
        """N-gram drafts proposed but not verified, compared with the tokens decoded since:
        the request's acceptance measured for free, once they differ or SHADOW_EARLY of them
        came true (counted then as a chain that held: while a shadow is pending the request
        neither looks up nor verifies, and waiting for all 8 drafts of a text that has just
        begun to repeat itself cost 8 decode steps before the first verify)."""
        st = req.spec
        if not st.shadow:
            return
        seq = req.seq
        came = seq[st.shadow_at : st.shadow_at + len(st.shadow)]
        if not came:
            return
        kept = 0
        for a, b in zip(came, st.shadow, strict=False):
            if a != b:
                break
            kept += 1
        if kept == len(came) and kept < min(len(st.shadow), SHADOW_EARLY):
            return  # all true so far: wait for more
        self._count(st, kept, kept < len(came))
        st.shadow = []

    def _count(self, st: SpecState, kept: int, rejected: bool) -> None:
        """A chain of drafts resolved: `kept` held, then one was `rejected` (or none)."""
        st.accept_w = ACCEPT_DECAY * st.accept_w + kept
        st.reject_w = ACCEPT_DECAY * st.reject_w + rejected
        self.accept_all = ENGINE_DECAY * self.accept_all + kept
        self.reject_all = ENGINE_DECAY * self.reject_all + rejected

    def observe(self, plan: StepPlan, seconds: float, rows: int) -> None:
        """A step of `rows` input rows ran in `seconds` (planning included): what decode and
        verify steps cost. (The rows are the forward's: after the step a verified request's
        length has grown by what it appended, so it no longer tells them.)"""
        if plan.extends or not (plan.decodes or plan.verifies):
            return
        seconds = max(seconds - self._draft_s, 1e-6)
        self._draft_s = 0.0
        if not plan.verifies:
            self.costs.observe_decode(len(plan.decodes), seconds)
            return
        self.costs.observe_verify(len(plan.decodes) + len(plan.verifies), rows, seconds)

    def release(self, req: Request) -> None:
        """`req` finished or was preempted: its draft model state goes."""
        if self.draft is not None:
            self.draft.release(id(req))

    # ---- drafting --------------------------------------------------------------------------
    def _wanted(self, req: Request, limit: int) -> int:
        """How many drafts `req` asks for this step (0 while it backs off)."""
        st = req.spec
        if st.skip > 0 and not self.cost_aware:
            st.skip -= 1
            return 0
        if self.cost_aware:  # the policy caps the chain from the measured acceptance
            return max(0, min(limit, self.config.num_draft_tokens))
        return max(0, min(limit, st.draft_len or self.config.num_draft_tokens))

    def _ngram(self, req: Request, k: int) -> list[int]:
        drafts = self.proposer.propose(req.seq, k)
        if drafts and req.constraint is not None:
            drafts = grammar_prefix(req.constraint, drafts)
        return drafts

    def _cap(self, items: list[tuple[Request, int]], batch: int, longest: list[int],
             model: bool) -> int:  # fmt: skip
        top = max(longest, default=0)
        if not self.cost_aware or top == 0:
            return top
        pairs = [(req, n) for (req, _), n in zip(items, longest, strict=True) if n > 0]
        # the draft model's prior: every request's chains (its drafts follow the target
        # alike everywhere); n-gram's: neutral (how much a text copies is its own)
        prior = acceptance(self.accept_all, self.reject_all) if model else PRIOR_ACCEPT
        accepts = [acceptance(r.spec.accept_w, r.spec.reject_w, prior) for r, _ in pairs]
        return self.costs.choose_cap(batch, accepts, [n for _, n in pairs], model)

    def accept(
        self, ctx: OutputContext, item: VerifyItem, logits: torch.Tensor, result: StepResult
    ) -> None:
        accepted, appended = accept_chain(ctx, item, logits, result)
        st = item.req.spec
        st.verify_ct += 1
        st.accepted += accepted
        st.verify_tokens += appended
        proposed = len(item.drafts)
        self._count(st, accepted, accepted < proposed)
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
