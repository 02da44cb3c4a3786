"""Shared pytest set-up: the environment of every test process, the property tests' profile,
the worker count, the shared servers as fixtures, and the `heavy` mark for tests that use the
real default model through them. A folder's own fixtures live in its conftest.py; helpers that
tests import live in tests/support/."""

from __future__ import annotations

import os

import pytest

from tests.support.server_process import ServerProcess, shared_default_server, shared_server
from tests.support.triton_kernels import interpreter_env

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton kernels run in its interpreter on CPU, for the whole session
# (tests/support/triton_kernels.py)
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


# fixtures that load the real default model: a test using one (directly or through another
# fixture) is marked `heavy`, so `-m "not heavy"` leaves it out
HEAVY_FIXTURES = frozenset({"default_server"})


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.heavy)


@pytest.fixture(scope="module")
def server() -> ServerProcess:
    """The tiny-model server the test modules of one worker share (started on first use,
    restarted if it died)."""
    return shared_server()


@pytest.fixture(scope="module")
def default_server() -> ServerProcess:
    """The default-model server (SmolLM2-135M) the heavy test modules of one worker share."""
    return shared_default_server()
