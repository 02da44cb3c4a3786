"""`python -m runtime.cluster --replicas N [--model PATH] [--policy P] [--host H] [--port P]`
(or `--prefill N --decode M`: prefill-decode disaggregation)

Starts N `runtime.server` replicas and the SGLang Model Gateway in front of them (with
`--prefill N --decode M`: N prefill and M decode servers, the gateway in PD mode), prints one
line `router: http://HOST:PORT` on standard output once the gateway routes to every replica,
restarts a replica that dies, and stops everything on Ctrl-C or SIGTERM (exit status 0).
Logs go to standard error; the children's logs to files in --log-dir.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from runtime import options
from runtime.cluster.cluster import Cluster, ClusterConfig
from runtime.cluster.errors import ClusterError
from runtime.cluster.gateway import POLICIES

logger = logging.getLogger("runtime.cluster")
# passed on to every replica when not the default (the transfer backend: in PD mode)
REPLICA_FLAGS = ("tp_size", "pp_size", "ep_size", "device")


class _StopRequested(BaseException):
    """Raised by the signal handler while the cluster is still starting."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m runtime.cluster",
        description="N runtime.server replicas behind the SGLang Model Gateway.",
    )
    p.add_argument("--replicas", type=int, default=2, help="server processes to start")
    p.add_argument(
        "--prefill", type=int, default=0, help="PD mode: prefill servers (with --decode)"
    )
    p.add_argument("--decode", type=int, default=0, help="PD mode: decode servers")
    p.add_argument("--policy", choices=POLICIES, default="cache_aware", help="routing policy")
    p.add_argument("--host", default="127.0.0.1", help="where the router listens")
    p.add_argument("--port", type=int, default=30000, help="router port (0: a free one)")
    p.add_argument(
        "--server-args",
        default="",
        help='extra flags for every replica, e.g. "--mem-budget-gb 1 --num-threads 1"',
    )
    p.add_argument("--log-dir", type=Path, default=None, help="children's logs (default: temp)")
    p.add_argument("--health-check-interval", type=int, default=5, help="router's, in seconds")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds per replica")
    p.add_argument("--log-level", default="info")
    # the replicas' engine flags that the cluster passes on (runtime/options.py's table)
    titles = {group: f"every replica's {title}" for group, title in options.GROUPS.items()}
    options.add_flags(p, [o for o in options.OPTIONS if o.cluster], cluster=True, titles=titles)
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> ClusterConfig:
    return ClusterConfig(
        replicas=args.replicas,
        prefill=args.prefill,
        decode=args.decode,
        model=args.model,
        policy=args.policy,
        host=args.host,
        port=args.port,
        server_args=shlex.split(args.server_args)
        + options.forwarded_flags(args, REPLICA_FLAGS)
        + (
            ["--disaggregation-transfer-backend", args.disaggregation_transfer_backend]
            if args.prefill
            else []
        ),
        log_dir=args.log_dir,
        startup_timeout_s=args.startup_timeout,
        health_check_interval_s=args.health_check_interval,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    stop = threading.Event()
    serving = False

    def on_signal(signum: int, _frame: Any) -> None:
        logger.info("%s: stopping the cluster", signal.Signals(signum).name)
        stop.set()
        if not serving:
            raise _StopRequested  # unwinds start(), which stops what it started

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        cluster = Cluster(config_from_args(args))
        cluster.start()
    except _StopRequested:
        return 0
    except ClusterError as exc:
        logger.error("%s", exc)
        return 1
    serving = True
    print(f"router: {cluster.router_url}", flush=True)
    try:
        cluster.serve_forever(stop)
    except ClusterError as exc:
        logger.error("%s", exc)
        cluster.stop(keep_logs=True)
        return 1
    cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
