"""How many threads a CPU forward uses, chosen by measuring: all of them, or one.

On a quiet 2-core machine two threads make a decode step ~1.5x faster than one. On a shared
machine they can make it 5-20x slower: each oneDNN matmul ends at a barrier that waits for the
thread the OS has descheduled (measured here: a batch-16 decode step 240-900 ms with two
threads beside other busy processes, 48-77 ms with one). vLLM's CPU build sidesteps it by
running the model on one pinned core; here the engine measures.

`ThreadChooser.forward` runs the model with the current choice, and every `period` decode steps
one trial step with the other (prefill steps run with the current choice, unmeasured). A step's
cost is its seconds per unit of work (tokens plus a fixed share for reading the weights); the
trial wins when it is clearly cheaper than the recent average of the current choice. A losing
trial doubles the period (up to `MAX_PERIOD`), so a quiet machine pays about one slower step in
a hundred. oneDNN's matmuls give the same bits with one thread or two (checked for every
projection shape at 1-512 rows, fp32 and bf16), so the choice does not change tokens.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

FIXED_TOKENS = 32  # a step's fixed cost (reading every weight once), in tokens of work
MIN_PERIOD, MAX_PERIOD = 8, 128
WIN_MARGIN = 0.9  # the trial must cost less than this share of the current average


def chooser_wanted(num_threads: int | None, device: torch.device) -> bool:
    """On unless the thread count was given, the device is not a CPU, torch has one thread, or
    SGL_ADAPTIVE_THREADS=0."""
    if num_threads or device.type != "cpu" or torch.get_num_threads() < 2:
        return False
    return os.environ.get("SGL_ADAPTIVE_THREADS", "1").strip() != "0"


class ThreadChooser:
    """A model wrapper: `forward(batch, pool)` with a measured thread count; every other
    attribute is the model's own. Runs on the one thread that calls forward."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.choices = (torch.get_num_threads(), 1)
        self.current = 0  # index into choices
        self._average: float | None = None  # seconds per unit of work, current choice
        self._period = MIN_PERIOD
        self._since_trial = 0
        self.switches = 0

    _OWN = frozenset(("_model", "choices", "current", "_average", "_period", "_since_trial",
                      "switches"))  # fmt: skip

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # the model's own settings (e.g. DeepSeek's `absorb`) go to the model
        if name in ThreadChooser._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._model, name, value)

    @property
    def threads(self) -> int:
        return self.choices[self.current]

    def forward(self, batch: Any, pool: Any) -> Any:
        # only decode steps are measured and tried: their costs are comparable with each other
        decode = batch.num_decode == batch.num_tokens
        if not decode:
            return self._model.forward(batch, pool)
        self._since_trial += 1
        trial = self._average is not None and self._since_trial >= self._period
        choice = 1 - self.current if trial else self.current
        if trial:
            torch.set_num_threads(self.choices[choice])
        start = time.perf_counter()
        try:
            return self._model.forward(batch, pool)
        finally:
            cost = (time.perf_counter() - start) / (batch.num_tokens + FIXED_TOKENS)
            if trial:
                self._judge(choice, cost)
                torch.set_num_threads(self.threads)
            else:
                self._average = cost if self._average is None else 0.7 * self._average + 0.3 * cost

    def _judge(self, choice: int, cost: float) -> None:
        self._since_trial = 0
        if self._average is not None and cost < WIN_MARGIN * self._average:
            self.current, self._average = choice, cost
            self._period = MIN_PERIOD
            self.switches += 1
        else:
            self._period = min(2 * self._period, MAX_PERIOD)
