"""When drafting pays: the step costs measured online against the tokens drafts are expected to
add.

`StepCosts` keeps, from the engine's own steps (decode and verify steps only; a step with a
prefill says nothing about either): the seconds of a plain decode step per batch size, and in
such decode steps what a verify step costs per number of rows it computes and what a draft
model's forward costs per batch size (ratios: the machine's load moves them all together).
`choose_cap` weighs, for each cap on the drafts a request may verify this step, the expected
tokens (per request, a chain of k drafts each kept with the request's measured per-draft
acceptance p yields 1 + p + ... + p^k tokens) against the step's expected seconds, and keeps
the best cap, or none when no cap beats decoding by MARGIN. Steps without a measurement of
their cost yet explore (a verify estimate comes from verifying), and every EXPLORE-th step
that chose not to draft drafts anyway with a short cap, so costs and acceptance are measured
again when the text changes (for n-gram drafts only where a request keeps half its drafts:
their acceptance is measured without verifying). A step that drafts nothing must cost what a
plain decode step costs, so the usual no-draft decision is one bound, not a search.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque

WINDOW = 7  # the last observations of a cost kept; their median is the estimate
MAX_ROWS = 32  # verify steps of more rows than the batch plus this are not measured
OUTLIER = 8.0  # nor those dearer than this many decode steps
MARGIN = 0.10  # a cap must beat plain decoding by this fraction of its tokens/s (costs are noisy)
EXPLORE = 32  # steps not drafting between two exploring ones
EXPLORE_CAP = 2
HOPELESS = 8  # exploring that many times less often where drafting cannot pay
FIRST_CAP = 4  # the first verify's drafts (before any verify cost is known)
PRIOR_ACCEPT = 0.5  # a request's per-draft acceptance before it was measured, with weight:
PRIOR_WEIGHT = 1.0  # (with ACCEPT_DECAY 0.8 a request that never keeps a draft settles at
# 0.5 / 6 = 0.08: too low to verify even 2 rows, where a weight of 2 kept it at 0.14, enough
# to verify whenever a 2-row verify measured within 4% of a decode step under a noisy load)


class _Cost:
    """The median of the last WINDOW observations (one loaded step is no outlier's victim);
    the very first is left out when a second comes (a first call of a shape may allocate or
    compile)."""

    def __init__(self) -> None:
        self.seen: deque[float] = deque(maxlen=WINDOW)
        self.count = 0
        self.value = 0.0  # the median, kept up to date (read several times every step)

    def add(self, seconds: float) -> None:
        self.count += 1
        if self.count == 2:
            self.seen.clear()
        self.seen.append(seconds)
        self.value = statistics.median(self.seen)


def expected_tokens(p: float, k: int) -> float:
    """Tokens a verify of k drafts appends when each draft holds with probability p."""
    return float(k + 1) if p >= 1.0 else (1.0 - p ** (k + 1)) / (1.0 - p)


class StepCosts:
    def __init__(self) -> None:
        self.decode: dict[int, _Cost] = {}  # batch size -> seconds of a decode step
        # relative to the decode step of the same batch size at the time (the load of the
        # machine moves both; a cost measured under another load stays comparable):
        self.verify: dict[int, _Cost] = {}  # rows -> a verify step's decode steps
        self.draft: dict[int, _Cost] = {}  # batch size -> a draft forward's decode steps
        self.since_explore = 0
        self._slope: float | None = None  # verify cost per row past the measured counts

    def observe_decode(self, batch: int, seconds: float) -> None:
        self.decode.setdefault(batch, _Cost()).add(seconds)

    def observe_verify(self, batch: int, rows: int, seconds: float) -> None:
        """A verify step of `batch` requests computing `rows` tokens. Not kept: one longer than
        MAX_ROWS past the batch (forced text verified with its drafts, no guide to drafting)
        or dearer than OUTLIER decode steps (a first call compiling or loading something), nor
        one before a decode step of its batch size was measured."""
        base = self.decode_time(batch)
        if base is None or rows > batch + MAX_ROWS or seconds > OUTLIER * base:
            return
        self.verify.setdefault(rows, _Cost()).add(seconds / base)
        self._slope = None

    def observe_draft(self, batch: int, forwards: int, seconds: float) -> None:
        base = self.decode_time(batch)
        if forwards > 0 and base is not None:
            self.draft.setdefault(batch, _Cost()).add(seconds / forwards / base)

    def decode_time(self, batch: int) -> float | None:
        cost = self.decode.get(batch)
        return None if cost is None else cost.value

    def verify_time(self, rows: int, batch: int = 1) -> float | None:
        """Seconds of a verify step of `rows` rows among `batch` decoding requests, in that
        batch's decode steps: the cost measured at that row count, else the line between the
        nearest measured counts on either side (the model's paths change cost at some row
        count, so no one line fits all), else past the measured ones the nearest measured
        cost plus the slope that outliers do not move (Theil-Sen: the median of the pairwise
        slopes, never negative; with one count measured, proportional to the rows); never
        below one decode step (a verify computes at least the batch's decode rows: a line
        extrapolated below the least measured count had made a 2-row verify cost 0.8 of a
        decode step, so that any acceptance paid)."""
        base = self.decode_time(batch)
        if not self.verify or base is None:
            return None
        return max(self._verify_ratio(rows), 1.0) * base  # never below the decode it contains

    def _verify_ratio(self, rows: int) -> float:
        if rows in self.verify:
            return self.verify[rows].value
        keys = sorted(self.verify)
        i = bisect.bisect_left(keys, rows)
        if 0 < i < len(keys):
            lo, hi = keys[i - 1], keys[i]
            t_lo, t_hi = self.verify[lo].value, self.verify[hi].value
            return t_lo + (t_hi - t_lo) * (rows - lo) / (hi - lo)
        end = keys[0] if i == 0 else keys[-1]
        if self._slope is None:
            pts = [(r, c.value) for r, c in self.verify.items()]
            if len(pts) == 1:
                self._slope = pts[0][1] / pts[0][0]
            else:
                slopes = [(t2 - t1) / (r2 - r1) for j, (r1, t1) in enumerate(pts)
                          for r2, t2 in pts[j + 1 :]]  # fmt: skip
                self._slope = max(0.0, statistics.median(slopes))
        return self.verify[end].value + self._slope * (rows - end)

    def draft_time(self, batch: int, forwards: int) -> float:
        """Seconds of `forwards` draft forwards for `batch` requests (0 for a proposer without
        a model; the nearest measured batch size when this one was not measured)."""
        base = self.decode_time(batch)
        if forwards <= 0 or not self.draft or base is None:
            return 0.0
        near = batch if batch in self.draft else min(self.draft, key=lambda b: abs(b - batch))
        return self.draft[near].value * forwards * base

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
        if self.verify_time(batch + 1, batch) is None:
            return min(top, FIRST_CAP)  # no verify measured yet: measure one
        best_cap, best_rate = 0, batch / base
        # every draft at the cheapest verify's cost (a bound on any cap's rate) not beating
        # decoding: no cap does (the usual step of a request whose text does not copy)
        most = batch - len(accepts) + sum(map(expected_tokens, accepts, longest))
        if most < best_rate * (1.0 + MARGIN) * self._cheapest_verify(batch):
            return self._no_draft(top, accepts, model_forwards, batch, longest)
        for cap in sorted({1, 2, 3, 4, 6, 8, 12, 16, top}):
            if cap > top:
                continue
            rate = self._rate(batch, accepts, longest, cap, model_forwards)
            if rate > best_rate * (1.0 + MARGIN if best_cap == 0 else 1.0):
                best_cap, best_rate = cap, rate
        if best_cap == 0:
            return self._no_draft(top, accepts, model_forwards, batch, longest)
        return best_cap

    def _rate(self, batch: int, accepts: list[float], longest: list[int], cap: int,
              model_forwards: bool) -> float:  # fmt: skip
        """Expected tokens per second of a step verifying at most `cap` drafts a request."""
        drafts = [min(cap, n) for n in longest]
        tokens = batch - len(accepts) + sum(map(expected_tokens, accepts, drafts))
        base = self.decode_time(batch) or 1.0
        seconds = self.verify_time(batch + sum(drafts), batch) or base
        seconds += self.draft_time(batch, cap if model_forwards else 0)
        return tokens / seconds

    def _cheapest_verify(self, batch: int) -> float:
        """A lower bound of `verify_time` at any row count past `batch` (measured and
        interpolated costs are at least the least measured; extrapolated ones grow with rows)."""
        least = max(min(c.value for c in self.verify.values()), 1.0)
        least *= self.decode_time(batch) or 0.0
        return min(least, self.verify_time(batch + 1, batch) or least)

    def _no_draft(self, top: int, accepts: list[float], model_forwards: bool, batch: int,
                  longest: list[int]) -> int:  # fmt: skip
        """No cap pays this step: 0, or every EXPLORE-th time a short exploring cap, to measure
        acceptance and costs again. N-gram drafts explore only for a request that keeps half
        its drafts or more (a close call): their acceptance is measured without verifying
        (the drafts offered are checked against the output), and verifying text that does not
        copy only loses time. A draft model whose measured costs lose even if every draft
        held (its forwards cost too much beside the target's) explores HOPELESS times less
        often: each exploration pays the draft's catch-up over every token since the last."""
        if not model_forwards and max(accepts, default=0.0) < PRIOR_ACCEPT:
            return 0
        every = EXPLORE
        if model_forwards and self._hopeless(batch, longest):
            every = EXPLORE * HOPELESS
        self.since_explore += 1
        if self.since_explore >= every:
            self.since_explore = 0
            return min(EXPLORE_CAP, top)
        return 0

    def _hopeless(self, batch: int, longest: list[int]) -> bool:
        """No cap beats decoding by MARGIN even with every draft held."""
        base = self.decode_time(batch)
        if base is None or not self.draft:
            return False
        sure = [1.0] * len(longest)
        bar = batch / base * (1.0 + MARGIN)
        return all(self._rate(batch, sure, longest, cap, True) <= bar
                   for cap in {1, 2, 4, 8, max(longest)})  # fmt: skip


def acceptance(accepted: float, rejected: float, prior: float = PRIOR_ACCEPT) -> float:
    """A per-draft acceptance from (decayed) counts of kept drafts and of chains that ended
    in a rejected one, with `prior` weighing PRIOR_WEIGHT chains."""
    return (accepted + prior * PRIOR_WEIGHT) / (accepted + rejected + PRIOR_WEIGHT)
