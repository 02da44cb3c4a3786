"""Shared pytest set-up. Part-specific fixtures live in tests/_<part>_fixtures.py modules."""

from __future__ import annotations

import os

from tests.support.triton_kernels import interpreter_env

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton kernels run in its interpreter on CPU, for the whole session (tests/_kernel_fixtures.py)
interpreter_env(os.environ)


def _hypothesis_profile() -> None:
    """Property tests draw the same examples on every run (CI must not meet a new random
    case each time); `HYPOTHESIS_PROFILE=explore` draws fresh ones."""
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
    settings.register_profile("explore", deadline=None, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


_hypothesis_profile()


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): one worker per core, at most 4 (each starts its own
    shared servers; most tests keep one core busy: engines with one thread, a server answering
    while the test waits). `-n 0` runs the suite in one process."""
    return max(1, min(4, len(os.sched_getaffinity(0))))
