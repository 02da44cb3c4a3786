"""One rank of a parallel engine: loads its shard, then runs what the driver broadcasts.

On GPUs (device "cuda") each rank holds its weights and pool on `cuda:<local rank>` and its
stage's collectives run over NCCL (workers/layout.py); the batch arrives on the host and is
copied over, the logits go back to rank 0 from the host. Commands (broadcast from rank 0 as
Python objects): ("forward", [ForwardBatch, ...]): run
this rank's part of each micro-batch in turn, the last stage's first rank sending each one's
logits to rank 0; ("set", name, value): set
a model attribute (e.g. MLA's `absorb`); ("stop",): leave. Any error ends the process, which
the driver sees as a failed step. A rank whose peer vanished (gloo: "Connection closed by
peer") exits with `PEER_LOST`, so the driver names the rank that died, not those it took down.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from runtime import settings
from runtime.attention import make_backend
from runtime.device import building_on, place_state
from runtime.device.cuda import bind
from runtime.memory.kv_pool import KVPool, checkpoint_kv_scales, resolve_dtype
from runtime.models.loader import load_model_files
from runtime.models.registry import model_class
from runtime.parallel.shard import heads_of, local_config
from runtime.workers.layout import Layout

logger = logging.getLogger(__name__)
TIMEOUT = timedelta(minutes=10)
PEER_LOST = 75  # exit status of a rank that stopped because another rank's connection closed
# what gloo's TCP transport says when the other end of a pair is gone (its errors name their
# source file under gloo/transport)
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
              "gloo/transport")  # fmt: skip


def main(rank: int, layout: Layout, addr: str, model_path: str, threads: int,
         device: str = "cpu") -> None:  # fmt: skip
    torch.set_num_threads(threads)
    settings.set_default(settings.TOKENIZERS_PARALLELISM, "false")
    gpu = device == "cuda"
    where = torch.device(f"cuda:{layout.local_rank(rank)}" if gpu else "cpu")
    bind(where)  # this rank's GPU (nothing on the CPU)
    dist.init_process_group("gloo", init_method=addr, rank=rank, world_size=layout.world,
                            timeout=TIMEOUT)  # fmt: skip
    comm = layout.make_comm(rank, device)
    shard = layout.shard(rank)
    box: list = [None]
    dist.broadcast_object_list(box, src=0)  # the driver's setup: dtype and the pool's pages
    dtype, num_pages, page_size = resolve_dtype(box[0]["dtype"]), *box[0]["pages"]
    loaded = load_model_files(model_path)
    config = loaded.config
    attention = make_backend(box[0]["attention"])
    kv_dtype = getattr(torch, box[0].get("kv_dtype", str(dtype).replace("torch.", "")))
    mine = list(shard.layers(config.num_layers))  # this rank's layers: its pool's indices
    scales = {name: [per_layer[i] for i in mine] for name, per_layer in
              checkpoint_kv_scales(loaded.state_dict, config.num_layers).items()}  # fmt: skip
    offsets = None
    calibration = box[0].get("kv_calibration")  # measured by the driver on the whole model
    if calibration is not None and calibration.scales:
        _, _, kv0, kv = heads_of(config, shard) if shard.tp_size > 1 else (0, 0, 0,
                                                                          config.num_kv_heads)
        calibration = calibration.select(mine, slice(kv0, kv0 + kv))
        scales, offsets = calibration.scales, calibration.offsets
    state = place_state(loaded.state_dict, where)  # the same tensors on the CPU
    with building_on(where):
        model = model_class(config)(config, state, dtype, shard=shard, comm=comm,
                                    attention=attention)  # fmt: skip
    del loaded, state
    pool = KVPool(local_config(config, shard), num_pages, page_size, kv_dtype, scales=scales,
                  offsets=offsets, device=where)  # fmt: skip
    report = {
        "pid": os.getpid(),
        "weight_bytes": model.weight_bytes(),
        "kv_bytes_per_token": pool.bytes_per_token,
        "layers": len(model.layers),
        "expert_bytes": model.expert_bytes() if hasattr(model, "expert_bytes") else 0,
    }
    dist.gather_object(report, None, dst=0)
    sends_logits = rank == layout.logits_rank
    while True:
        box: list = [None]
        dist.broadcast_object_list(box, src=0)
        command = box[0]
        if command[0] == "stop":
            break
        if command[0] == "set":
            setattr(model, command[1], command[2])
        elif command[0] == "forward":  # micro-batches, in order: the stages overlap
            for part in command[1]:
                logits = model.forward(part.to(where) if gpu else part, pool)
                if sends_logits:  # to the driver over gloo: from the host
                    dist.send(logits.contiguous().cpu(), dst=0)
        elif command[0] == "comm_seconds":
            dist.gather_object(comm.seconds, None, dst=0)
    dist.destroy_process_group()


def spawn(layout: Layout, ranks: range, addr: str, model: str,
          device: str = "cpu") -> list[tuple[object, object]]:  # fmt: skip
    """Start `ranks` as `python -m runtime.workers.worker` processes, each with its share of
    this machine's CPU threads (and with `device` "cuda", its own GPU);
    [(Popen, its stderr log file)]."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    threads = max(1, (os.cpu_count() or 1) // max(len(ranks), 1))
    root = str(Path(__file__).resolve().parents[2])
    env = settings.child_environment(
        PYTHONPATH=root + os.pathsep + (settings.PYTHONPATH.get() or "")
    )
    env["OMP_NUM_THREADS"] = str(threads)
    fields = {name: getattr(layout, name) for name in Layout.__slots__}
    out = []
    for rank in ranks:
        job = dict(rank=rank, layout=fields, addr=addr, model=model, threads=threads,
                   device=device)  # fmt: skip
        log = tempfile.TemporaryFile()  # a pipe could fill up and block the rank
        proc = subprocess.Popen(
            [sys.executable, "-m", "runtime.workers.worker", json.dumps(job)],
            env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
        )  # fmt: skip
        out.append((proc, log))
    return out


def _cli() -> None:
    """`python -m runtime.workers.worker JSON`: how a rank is started (see `spawn`)."""
    import json
    import sys

    job = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.WARNING)
    try:
        main(job["rank"], Layout(**job["layout"]), job["addr"], job["model"], job["threads"],
             job.get("device", "cpu"))  # fmt: skip
    except RuntimeError as exc:  # torch.distributed's errors are RuntimeErrors
        if not (isinstance(exc, dist.DistError) or any(t in str(exc) for t in _PEER_GONE)):
            raise
        print(f"rank {job['rank']}: a peer's connection closed: {exc}", file=sys.stderr)
        sys.exit(PEER_LOST)


if __name__ == "__main__":
    _cli()
