"""Where an engine runs: the device (`placement`), decode steps through static padded buffers
replayed per batch-size bucket (`graph_runner`), the few lines only a GPU runs (`cuda`:
CUDA-graph capture and replay, binding a thread to its GPU), and the one owner of the model at
run time (`runner.ModelRunner`: placement, thread choice, graph replay, the parallel driver)."""

from runtime.device.graph_runner import (
    DecodeGraphs,
    EagerReplayer,
    decode_graphs,
    default_batch_sizes,
)
from runtime.device.placement import building_on, place_state, resolve_device
from runtime.device.runner import ModelRunner, RunnerStats

__all__ = [
    "DecodeGraphs",
    "EagerReplayer",
    "ModelRunner",
    "RunnerStats",
    "building_on",
    "decode_graphs",
    "default_batch_sizes",
    "place_state",
    "resolve_device",
]
