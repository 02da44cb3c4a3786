"""Data-parallel replicas of `runtime.server` behind the SGLang Model Gateway (`sglang-router`).

`python -m runtime.cluster --replicas N [--model PATH] [--policy cache_aware]` starts the
replicas on free loopback ports and the gateway in front, and prints `router: URL`.
"""

from runtime.cluster.cluster import Cluster, ClusterConfig
from runtime.cluster.errors import ClusterError

__all__ = ["Cluster", "ClusterConfig", "ClusterError"]
