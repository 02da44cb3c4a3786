"""Fixtures of the server tests: an `openai` client of the module's `server` (the shared
tiny-model server unless a module serves another) and the name of the model it serves."""

from __future__ import annotations

import openai
import pytest


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id
