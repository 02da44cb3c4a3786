"""Typed errors of the DSL. Each message says what was wrong and where."""

from __future__ import annotations


class SglError(Exception):
    """Base class of every error the DSL raises on its own."""


class TraceError(SglError):
    """A program used a traced value (an argument, a variable) as a Python value."""


class ProgramError(SglError):
    """A program was written wrongly: unbalanced roles, unknown variable, bad join."""


class BackendError(SglError):
    """The backend failed a request (the engine's own error is chained as the cause)."""


class NoBackendError(SglError):
    """A program was run with no backend given and no default backend set."""
