"""How many threads a CPU forward uses, chosen by measuring: all of them, or one.

On a quiet 2-core machine two threads make a decode step ~1.5x faster than one. On a shared
machine they can make it 5-50x slower: each oneDNN matmul ends at a barrier that waits for the
thread the OS has descheduled (measured here: a batch-16 decode step 200-2,200 ms with two
threads beside other busy processes, 29-77 ms with one). vLLM's CPU build sidesteps it by
running the model on one pinned core; here the engine measures.

`ThreadChooser.forward(model, batch, pool)` runs the model with the current choice (the engine's
`device.runner.ModelRunner` calls it; the chooser holds no model), and now and then one trial decode
step with the other (prefill steps run with the current choice, unmeasured). A step's cost is its
seconds per unit of work (tokens plus a fixed share for reading the weights); the trial wins when
it costs less than 0.9x the recent average of the current choice, and then wins a second trial
against the average of a few fresh steps (one win can be noise: a burst elsewhere, or an
average still holding a previous workload's dearer steps, as the cost counts no attention:
after the few-shot workload's 1,500-token contexts a one-thread trial won at the start of the
16-request decode workload, which then ran one thread, 1.35x slower, until the next trial). The
first trial comes after 2
decode steps (a warm-up request decides); after each trial the period at least doubles and grows
until trials of the losing choice, however slow, take at most 2% of the decode time (a quiet
machine pays one 1.5x-slower step in ~75, then fewer). oneDNN's matmuls give the same bits with
one thread or two (checked for every projection shape at 1-512 rows, fp32 and bf16), so the
choice does not change tokens.
"""

from __future__ import annotations

import math
import queue
import threading
import time

import torch

from runtime import settings
from runtime.attention.forward_batch import ForwardBatch
from runtime.kernels.cpu import fused as cpu_fused
from runtime.memory.kv_pool import KVPool
from runtime.models.layers import GEMV_ROWS
from runtime.models.model import Model

FIXED_TOKENS = 32  # a step's fixed cost (reading every weight once), in tokens of work
FIRST_TRIAL = 2  # decode steps before the first trial (a warm-up request decides)
MAX_PERIOD = 4096
WIN_MARGIN = 0.9  # the trial must cost less than this share of the current average
CONFIRM_AFTER = 4  # decode steps between a winning trial and the trial that confirms it
TRIAL_SHARE = 0.02  # losing trials may cost at most this share of the decode time


def chooser_wanted(num_threads: int | None, device: torch.device) -> bool:
    """On unless the thread count was given, the device is not a CPU, torch has one thread, or
    SGL_ADAPTIVE_THREADS=0."""
    if num_threads or device.type != "cpu" or torch.get_num_threads() < 2:
        return False
    return settings.ADAPTIVE_THREADS.get()


class ThreadChooser:
    """The measured thread count: `forward(model, batch, pool)` runs `model.forward` with it.
    Runs on the one thread that calls forward."""

    def __init__(self) -> None:
        self.choices = (torch.get_num_threads(), 1)
        self.current = 0  # index into choices
        self._average: float | None = None  # seconds per unit of work, current choice
        self._period = FIRST_TRIAL
        self._since_trial = 0
        self._confirming: int | None = None  # the period to resume after a confirming trial
        self.switches = 0

    @property
    def threads(self) -> int:
        return self.choices[self.current]

    def forward(self, model: Model, batch: ForwardBatch, pool: KVPool) -> torch.Tensor | None:
        # only decode steps are measured and tried: their costs are comparable with each other
        decode = batch.num_decode == batch.num_tokens
        if not decode:
            return model.forward(batch, pool)
        self._since_trial += 1
        trial = self._average is not None and self._since_trial >= self._period
        choice = 1 - self.current if trial else self.current
        if trial:
            torch.set_num_threads(self.choices[choice])
        start = time.perf_counter()
        try:
            return model.forward(batch, pool)
        finally:
            cost = (time.perf_counter() - start) / (batch.num_tokens + FIXED_TOKENS)
            if trial:
                self._judge(choice, cost)
                torch.set_num_threads(self.threads)
            else:
                self._average = cost if self._average is None else 0.7 * self._average + 0.3 * cost

    def _judge(self, choice: int, cost: float) -> None:
        self._since_trial = 0
        assert self._average is not None
        ratio = cost / self._average
        if ratio < WIN_MARGIN and self._confirming is None:
            # won once: another trial must win too, against the average of CONFIRM_AFTER fresh
            # steps of the current choice (the old average may hold another workload's steps:
            # a step's cost counts no attention, so long contexts make it dearer)
            self._confirming, self._period = self._period, CONFIRM_AFTER
            self._average = None
            return
        if self._confirming is not None:  # the confirming trial: the period as it was
            self._period, self._confirming = self._confirming, None
        if ratio < WIN_MARGIN:
            self.current, self._average = choice, cost
            self.switches += 1
            # the next trial runs the choice that just lost: it may be very slow (beside busy
            # processes, two threads cost ~50x one): not sooner than its cost allows
            ratio = 1 / ratio
        # a trial costing `ratio` steps every `period` steps stays under TRIAL_SHARE
        self._period = min(max(2 * self._period, math.ceil(ratio / TRIAL_SHARE)), MAX_PERIOD)



class WaitChoice:
    """libgomp's wait after a parallel region, chosen per step for a dense CPU model.

    libgomp's workers spin ~300,000 pauses after a region before they sleep, unless it manages
    more threads than there are CPUs: then 100 (its throttled count). A second thread that
    holds an OpenMP team of its own makes the count throttled (`fused.hold_openmp_team`);
    freeing that team (`fused.release_openmp_team`) brings the long spin back. The long spin
    suits steps of many back-to-back OpenMP regions (a prompt's oneDNN products: each wake-up
    would cost ~35 us against ~7); the throttled one suits decode steps, whose products and
    attention run on the kernels' spinning pool (csrc/pool.h) and whose few OpenMP regions
    (the sampler's reductions) would otherwise leave a worker spinning for milliseconds on the
    core the pool's worker wants. A quantized model's engine holds such a team for good
    (engine.py); a dense one takes this per-step choice.

    `step(batch)` asks for the throttled wait on a step of at most `layers.GEMV_ROWS` tokens
    (its products on the pool) and the long spin on a larger one (its products on oneDNN's
    OpenMP regions: a prompt, or a decode of more requests); a helper thread holds or frees
    its team when the wish changes (the step waits for nothing: the change lands by the next
    regions). Neither changes any result. `close()` frees the team and ends the thread."""

    def __init__(self) -> None:
        self.throttled = False
        self.switches = 0  # times the wish changed
        self._orders: queue.SimpleQueue[bool | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="sgl-omp-wait", daemon=True)
        self._thread.start()

    def step(self, batch: ForwardBatch) -> None:
        want = batch.num_tokens <= GEMV_ROWS
        if want != self.throttled:
            self.throttled = want
            self.switches += 1
            self._orders.put(want)

    def _serve(self) -> None:
        while True:
            order = self._orders.get()
            if order:
                cpu_fused.hold_openmp_team()
            else:
                cpu_fused.release_openmp_team()
            if order is None:
                return

    def close(self) -> None:
        """Free the helper's team and end its thread (idempotent)."""
        if self._thread.is_alive():
            self._orders.put(None)
            self._thread.join()
