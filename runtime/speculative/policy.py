"""When drafting pays: the step costs measured online against the tokens drafts are expected to
add.

`StepCosts` keeps, from the engine's own steps (decode and verify steps only; a step with a
prefill says nothing about either): the seconds of a plain decode step per batch size, of a
verify step per number of rows it computes, and of a draft model's forward per batch size.
`choose_cap` weighs, for each cap on the drafts a request may verify this step, the expected
tokens (per request, a chain of k drafts each kept with the request's measured per-draft
acceptance p yields 1 + p + ... + p^k tokens) against the step's expected seconds, and keeps
the best cap, or none when no cap beats decoding by MARGIN. Steps without a measurement of
their cost yet explore (a verify estimate comes from verifying), and every EXPLORE-th step
that chose not to draft drafts anyway with a short cap, so costs and acceptance are measured
again when the text changes.
"""

from __future__ import annotations

DECAY = 0.7  # weight of the previous estimate in a running mean
MARGIN = 0.03  # a cap must beat plain decoding by this fraction of its tokens/s
EXPLORE = 32  # steps not drafting between two exploring ones
EXPLORE_CAP = 2
PRIOR_ACCEPT = 0.5  # a request's per-draft acceptance before it was measured, with weight:
PRIOR_WEIGHT = 2.0


def _mix(old: float | None, new: float) -> float:
    return new if old is None else DECAY * old + (1 - DECAY) * new


def expected_tokens(p: float, k: int) -> float:
    """Tokens a verify of k drafts appends when each draft holds with probability p."""
    return float(k + 1) if p >= 1.0 else (1.0 - p ** (k + 1)) / (1.0 - p)


class StepCosts:
    def __init__(self) -> None:
        self.decode: dict[int, float] = {}  # batch size -> seconds
        self.verify: dict[int, float] = {}  # rows -> seconds
        self.draft: dict[int, float] = {}  # batch size -> seconds per draft forward
        self.since_explore = 0

    def observe_decode(self, batch: int, seconds: float) -> None:
        self.decode[batch] = _mix(self.decode.get(batch), seconds)

    def observe_verify(self, rows: int, seconds: float) -> None:
        self.verify[rows] = _mix(self.verify.get(rows), seconds)

    def observe_draft(self, batch: int, forwards: int, seconds: float) -> None:
        if forwards > 0:
            self.draft[batch] = _mix(self.draft.get(batch), seconds / forwards)

    def decode_time(self, batch: int) -> float | None:
        return self.decode.get(batch)

    def verify_time(self, rows: int) -> float | None:
        """Measured at `rows`, else the least-squares line through the measured row counts
        (with one, proportional to the rows)."""
        if rows in self.verify:
            return self.verify[rows]
        if not self.verify:
            return None
        pts = list(self.verify.items())
        if len(pts) == 1:
            r, t = pts[0]
            return t * rows / r
        n = len(pts)
        mx = sum(r for r, _ in pts) / n
        my = sum(t for _, t in pts) / n
        sxx = sum((r - mx) ** 2 for r, _ in pts)
        slope = max(0.0, sum((r - mx) * (t - my) for r, t in pts) / sxx)
        return max(my + slope * (rows - mx), 1e-6)

    def draft_time(self, batch: int, forwards: int) -> float:
        """Seconds of `forwards` draft forwards for `batch` requests (0 for a proposer without
        a model; the nearest measured batch size when this one was not measured)."""
        if forwards <= 0 or not self.draft:
            return 0.0
        per = self.draft.get(batch)
        if per is None:
            per = self.draft[min(self.draft, key=lambda b: abs(b - batch))]
        return per * forwards

    def choose_cap(self, batch: int, accepts: list[float], longest: list[int],
                   model_forwards: bool) -> int:  # fmt: skip
        """The cap on drafts per request this step (0: none). `batch`: requests decoding this
        step; `accepts`: the per-draft acceptance of those that may draft; `longest`: the
        drafts each could verify (its proposals, or its draft length for a draft model);
        `model_forwards`: a cap of k costs k draft model forwards."""
        base = self.decode_time(batch)
        if base is None:
            return 0  # measure a plain decode step first
        top = max(longest, default=0)
        if top <= 0:
            return 0
        if self.verify_time(batch + 1) is None:
            return top  # no verify measured yet: measure one
        best_cap, best_rate = 0, batch / base
        for cap in sorted({1, 2, 3, 4, 6, 8, 12, 16, top}):
            if cap > top:
                continue
            drafts = [min(cap, n) for n in longest]
            tokens = batch - len(accepts) + sum(
                expected_tokens(p, d) for p, d in zip(accepts, drafts, strict=True)
            )
            seconds = self.verify_time(batch + sum(drafts)) or base
            seconds += self.draft_time(batch, cap if model_forwards else 0)
            rate = tokens / seconds
            if rate > best_rate * (1.0 + MARGIN if best_cap == 0 else 1.0):
                best_cap, best_rate = cap, rate
        if best_cap == 0:
            self.since_explore += 1
            if self.since_explore >= EXPLORE:
                self.since_explore = 0
                return min(EXPLORE_CAP, top)
        return best_cap


def acceptance(accepted: float, rejected: float) -> float:
    """A request's per-draft acceptance from its (decayed) counts of kept drafts and of
    verifies that rejected one, with the prior."""
    return (accepted + PRIOR_ACCEPT * PRIOR_WEIGHT) / (accepted + rejected + PRIOR_WEIGHT)
