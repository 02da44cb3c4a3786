"""Shared pytest set-up. Part-specific fixtures live in tests/_<part>_fixtures.py modules."""

from __future__ import annotations

import os

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
