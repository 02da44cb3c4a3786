"""Engines with and without speculation on the tiny random Llama, and a proposer that knows
the answer (so the verify path is exercised with long accepted chains and with wrong drafts,
whatever the random model writes)."""

from __future__ import annotations

import pytest

from runtime import Engine


class OracleProposer:
    """Drafts the reference continuation (`ref`: prompt + output ids of a run without
    speculation), with every `wrong_every`-th draft replaced by another token."""

    def __init__(self, refs: list[list[int]], wrong_every: int = 0) -> None:
        self.refs = refs
        self.wrong_every = wrong_every
        self.calls = 0

    def propose(self, tokens: list[int], k: int) -> list[int]:
        self.calls += 1
        for ref in self.refs:
            if ref[: len(tokens)] == tokens:
                drafts = list(ref[len(tokens) : len(tokens) + k])
                if self.wrong_every:
                    for i in range(self.wrong_every - 1, len(drafts), self.wrong_every):
                        drafts[i] = (drafts[i] + 1) % 1000 + 10
                return drafts
        return []


@pytest.fixture(scope="module")
def engines(model_dir):
    """(without speculation, with n-gram speculation), the same model."""
    base = Engine(str(model_dir), max_total_tokens=4096)
    spec = Engine(str(model_dir), max_total_tokens=4096, speculative_algorithm="NGRAM",
                  speculative_num_draft_tokens=6)  # fmt: skip
    # every proposal verified: these tests check verification, not when drafting pays
    spec.scheduler.call(lambda: setattr(spec.scheduler.speculation, "cost_aware", False))
    yield base, spec
    base.shutdown()
    spec.shutdown()


@pytest.fixture
def oracle(engines):
    """Installs an OracleProposer on the speculating engine for one test (then the n-gram
    proposer again)."""
    spec = engines[1]
    speculator = spec.scheduler.speculation
    original = speculator.proposer

    def install(refs: list[list[int]], wrong_every: int = 0) -> OracleProposer:
        proposer = OracleProposer(refs, wrong_every)
        spec.scheduler.call(lambda: setattr(speculator, "proposer", proposer))
        return proposer

    yield install
    spec.scheduler.call(lambda: setattr(speculator, "proposer", original))
