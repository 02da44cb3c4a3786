"""`with s.system():` / `s.user()` / `s.assistant()` blocks, for running and tracing states."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .ir import RoleBegin, RoleEnd


class RoleBlocks:
    """Role blocks for a state whose `+=` appends IR expressions."""

    @contextmanager
    def _role(self, role: str) -> Iterator[None]:
        self += RoleBegin(role)  # type: ignore[operator]
        yield
        self += RoleEnd(role)  # type: ignore[operator]

    def system(self) -> Any:
        return self._role("system")

    def user(self) -> Any:
        return self._role("user")

    def assistant(self) -> Any:
        return self._role("assistant")
