"""Where the tests find the repository and the team's shared data."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def shared_dir() -> Path:
    """The team's shared data: $SGL_SHARED_DIR, else shared/ beside the checkout (as CI lays it
    out). It may be missing; tests that need it skip and say which folder they looked for."""
    if os.environ.get("SGL_SHARED_DIR"):
        return Path(os.environ["SGL_SHARED_DIR"])
    return REPO.parent / "shared"
