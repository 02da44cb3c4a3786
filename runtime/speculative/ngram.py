"""N-gram lookup (prompt lookup decoding): the tokens that followed the latest earlier
occurrence of the request's longest matching suffix are its drafts."""

from __future__ import annotations

import numpy as np


class NgramProposer:
    """Suffixes of `min_window` .. `max_window` tokens are looked up in the request's own
    tokens (prompt and output); the longest that occurred before wins, the latest occurrence
    of it on a tie, and the tokens after that occurrence are the drafts."""

    def __init__(self, min_window: int, max_window: int) -> None:
        self.min_window = min_window
        self.max_window = max_window

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """At most `k` drafts to follow `tokens` ([] when no suffix occurred before)."""
        n = len(tokens)
        if k <= 0 or n < self.min_window + 1:
            return []
        seq = np.asarray(tokens, dtype=np.int64)
        # candidates: earlier positions i whose token equals the last one (a match ending at i)
        cand = np.flatnonzero(seq[: n - 1] == seq[n - 1])
        if cand.size == 0:
            return []
        length = np.ones(cand.size, dtype=np.int64)
        alive = np.ones(cand.size, dtype=bool)
        for j in range(1, min(self.max_window, n - 1)):
            back = cand - j
            ok = alive & (back >= 0)
            ok[ok] = seq[back[ok]] == seq[n - 1 - j]
            length += ok
            alive = ok
            if not alive.any():
                break
        best = int(length.max())
        if best < self.min_window:
            return []
        start = int(cand[np.flatnonzero(length == best)[-1]]) + 1  # the latest, on a tie
        return tokens[start : start + k]
