"""Fixtures of the DSL tests: an in-process `sgl.Runtime` on a tiny random Llama."""

from __future__ import annotations

import pytest

import sgl_dsl as sgl
from tests.support.dsl_backends import ENGINE_KWARGS, build_tiny_llama


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    folder = build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
    backend = sgl.Runtime(str(folder), **ENGINE_KWARGS)
    yield backend
    backend.shutdown()
