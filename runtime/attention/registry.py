"""Which attention backend an engine uses: `make_backend(name, device)`."""

from __future__ import annotations

import torch

from runtime.attention.base import AttentionBackend
from runtime.attention.cpu_backend import CPUBackend
from runtime.attention.torch_backend import TorchBackend
from runtime.attention.triton_backend import TritonBackend, load_triton
from runtime.errors import UnsupportedAttentionError

BACKENDS: dict[str, type[AttentionBackend]] = {
    "torch": TorchBackend,
    "cpu": CPUBackend,
    "triton": TritonBackend,
}
CHOICES = ("auto", *BACKENDS)


def resolve_backend(name: str, device: str | torch.device = "cpu") -> str:
    """The backend `name` stands for on `device`: "auto" is "cpu" on a CPU, "triton" on a GPU
    where triton imports (else "torch"); other names are checked and kept."""
    if name not in CHOICES:
        raise ValueError(f"attention_backend must be one of {list(CHOICES)}, got {name!r}")
    if name != "auto":
        return name
    if torch.device(device).type == "cpu":
        return "cpu"
    try:
        load_triton()
    except UnsupportedAttentionError:
        return "torch"
    return "triton"


def make_backend(name: str = "auto", device: str | torch.device = "cpu") -> AttentionBackend:
    """A fresh backend (one per model instance: it holds the step's plan)."""
    return BACKENDS[resolve_backend(name, device)]()
