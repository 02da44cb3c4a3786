"""The worker ranks of one machine of a multi-machine engine.

Node 0 runs the engine (`python -m runtime.server --tp 2 --pp 2 --nnodes 2 --node-rank 0
--dist-init-addr HOST0:PORT ...`, or `Engine(..., nnodes=2, dist_init_addr="HOST0:PORT")`);
every other machine runs its block of ranks with the same sizes and a copy of the model:

    python -m runtime.workers.launch --model PATH --tp 2 --pp 2 --nnodes 2 --node-rank 1 \\
        --dist-init-addr HOST0:PORT

(`python -m runtime.server ... --node-rank 1` does the same.) It exits when the engine shuts
down, with the ranks' worst exit status; SIGTERM stops its ranks.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from runtime import options
from runtime.config import load_config
from runtime.parallel.shard import validate
from runtime.workers.layout import Layout
from runtime.workers.worker import spawn

RANK_FLAGS = ("tp_size", "pp_size", "ep_size", "nnodes", "node_rank", "dist_init_addr")


def run_node(model: str, tp_size: int, pp_size: int, ep_size: int, nnodes: int,
             node_rank: int, dist_init_addr: str, device: str = "cpu") -> int:  # fmt: skip
    """`device`: "cpu" or "cuda" (each rank on `cuda:<local rank>`), as node 0's engine."""
    config = load_config(model)
    validate(config, tp_size, pp_size, ep_size)
    layout = Layout(tp_size, pp_size, ep_size, config.num_layers, nnodes)
    if not 0 < node_rank < nnodes:
        raise SystemExit(f"--node-rank must be in 1..{nnodes - 1} here (node 0 runs the engine)")
    procs = [proc for proc, _ in spawn(layout, layout.node_ranks(node_rank),
                                       f"tcp://{dist_init_addr}", model, device)]  # fmt: skip

    def stop(_signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while any(proc.poll() is None for proc in procs):
        if any(proc.poll() not in (None, 0) for proc in procs):
            stop(0, None)  # one rank failed: the engine sees it; do not leave the others
        time.sleep(0.2)
    return max(abs(proc.returncode) for proc in procs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runtime.workers.launch", description=__doc__)
    p.add_argument("--model", required=True, help="the model folder (same as node 0's)")
    # the ranks' sizes and rendezvous: the server's flags (runtime/options.py's table)
    options.add_flags(p, [options.option(n) for n in RANK_FLAGS], required=RANK_FLAGS[3:])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="as node 0's engine: cuda puts each rank on cuda:<local rank>")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    return run_node(a.model, a.tp_size, a.pp_size, a.ep_size, a.nnodes, a.node_rank,
                    a.dist_init_addr, a.device)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
