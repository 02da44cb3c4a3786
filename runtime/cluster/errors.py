"""The cluster's error type."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """A replica or the gateway could not be started, reached or configured."""
