"""The engine's device: which one `device="auto" | "cpu" | "cuda" | "cuda:N"` means here, a
checkpoint's tensors moved there and a model built there (`runner.ModelRunner` hands the model
each step's batch on its device).

What lives where on a GPU: the weights, the KV pool, each step's tensors, the logits and the
sampler's arithmetic are on the device; the scheduler, the radix tree, the page allocator and
the grammar stay on the host (a step's plan is built there and copied over; constrained rows'
packed bitmasks are stacked on the host and copied once per step by the mask kernel's
wrapper). On the CPU none of this code runs: `Engine(device="cpu")` builds the model and the
pool exactly as before and calls the model directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from runtime.device import cuda
from runtime.errors import DeviceUnavailableError
from runtime.kernels.cpu import quant as cpu_quant

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The device `spec` names here: "auto" is the current GPU when
    `torch.cuda.is_available()`, else the CPU; "cuda" is the current GPU, "cuda:N" GPU N.
    `DeviceUnavailableError` when a GPU is asked for and none (or not that one) is present;
    ValueError for anything else."""
    text = str(spec)
    if text == "auto":
        return cuda.current() if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(f"device must be one of {list(DEVICE_CHOICES)}, got {text!r}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ValueError(f"device must be one of {list(DEVICE_CHOICES)}, got {text!r}")
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"device {text!r} was asked for but CUDA is not available here "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); use device='cpu' "
            f"or device='auto'"
        )
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise DeviceUnavailableError(f"device {text!r}: this machine has {count} GPU(s)")
    return device if device.index is not None else cuda.current()


def place_state(state: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """A checkpoint's tensors on `device` (the same dict's values on the CPU). Weights a GGUF
    keeps in block formats (Q4_1, Q8_0, ...) have kernels on the CPU only: for another device
    they are dequantized on the host first (float32, as gguf's reference computes them; the
    model then casts them to its dtype), so a GGUF file runs on a GPU as its float weights."""
    if device.type == "cpu":
        return dict(state)
    out = {}
    for name, t in state.items():
        if cpu_quant.is_quantized(t):
            t = t.dequantize()
        out[name] = t.to(device)
    return out


@contextlib.contextmanager
def building_on(device: torch.device) -> Iterator[None]:
    """Tensors a model creates while it is built (biases, rotary frequencies, buffers) land on
    `device`; nothing changes on the CPU."""
    if device.type == "cpu":
        yield
        return
    with torch.device(device):
        yield
