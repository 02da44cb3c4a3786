"""N-gram lookup (prompt lookup decoding): the tokens that followed the latest earlier
occurrence of the request's longest matching suffix are its drafts. Where that occurrence is
so recent that fewer than k tokens follow it, the text has been repeating with that period, and
the drafts go on repeating it (they continue the tokens and the drafts before them)."""

from __future__ import annotations


class NgramProposer:
    """Suffixes of `min_window` .. `max_window` tokens are looked up in the request's own
    tokens (prompt and output); the longest that occurred before wins, the latest occurrence
    of it on a tie, and the tokens after that occurrence are the drafts.

    Runs once per decoding request and step, so it costs what a step must not notice: the
    tokens are reversed once (a C copy), earlier occurrences of the last token are found with
    `list.index` from the latest back, and each is extended only while it matches; the scan
    stops at the first occurrence of the longest possible match.

    A match ending p tokens before the end leaves only p tokens after it: the drafts then copy
    their own head (draft j is draft j - p), the text and its drafts read as one sequence
    (a repeated list item, a repeated pattern of a tiny model's output: the verify keeps
    what holds)."""

    def __init__(self, min_window: int, max_window: int) -> None:
        self.min_window = min_window
        self.max_window = max_window

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """At most `k` drafts to follow `tokens` ([] when no suffix occurred before)."""
        n = len(tokens)
        if k <= 0 or n < self.min_window + 1:
            return []
        rev = tokens[::-1]  # rev[m] is tokens[n - 1 - m]; rev[0] the last token
        last, limit = rev[0], min(self.max_window, n - 1)
        best = best_m = 0
        m = 0
        index = rev.index
        while best < limit:
            try:
                m = index(last, m + 1)  # the next earlier occurrence, the latest first
            except ValueError:
                break
            length = 1
            while length < limit and m + length < n and rev[m + length] == rev[length]:
                length += 1
            if length > best:  # strictly: on a tie the later occurrence (found first) wins
                best, best_m = length, m
        if best < self.min_window:
            return []
        start = n - best_m  # the token after that occurrence
        drafts = tokens[start : start + k]
        while len(drafts) < k:  # the occurrence is best_m tokens back: repeat that period
            drafts.append(drafts[len(drafts) - best_m])
        return drafts
