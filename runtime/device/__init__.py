"""Where an engine runs: the device (`placement`), decode steps through static padded buffers
replayed per batch-size bucket (`graph_runner`), and the few lines only a GPU runs (`cuda`:
CUDA-graph capture and replay, binding a thread to its GPU)."""

from runtime.device.graph_runner import (
    DecodeGraphRunner,
    EagerReplayer,
    default_batch_sizes,
    device_runner,
)
from runtime.device.placement import DeviceModel, building_on, place_state, resolve_device

__all__ = [
    "DecodeGraphRunner",
    "DeviceModel",
    "EagerReplayer",
    "building_on",
    "default_batch_sizes",
    "device_runner",
    "place_state",
    "resolve_device",
]
