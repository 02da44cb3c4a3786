"""Fixtures of the runtime tests: tiny random model folders (SmolLM2's tokenizer), built once
per test module."""

from __future__ import annotations

import pytest

from tests.support.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Llama."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    """A tiny random DeepSeek V2 (MLA attention)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-deepseek"), "deepseek_v2")
