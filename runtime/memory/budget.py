"""How much KV memory an engine reserves when it is not told, and what the process holds.

The rule: the KV of one full context of the model (`max_position_embeddings` tokens, clamped
to [MIN_TOKENS, MAX_TOKENS]), at most MEMORY_SHARE of the memory the machine has available at
start. A small model no longer reserves gigabytes it will not use (SmolLM2-135M: 8,192
tokens, 360 MiB in fp32, 180 MiB in bf16), a large one gets one whole context on a machine
that has room, and none takes more than a quarter of what is free. `mem_budget_gb` (or the
server's `--mem-budget-gb`) replaces the rule.

One full context is what one request of the model's longest length needs; requests of common
lengths share it (the scheduler preempts, the radix cache evicts when it runs short).
"""

from __future__ import annotations

import resource
from pathlib import Path

from runtime.config import ModelConfig

MIN_TOKENS = 4096
MAX_TOKENS = 32768
MEMORY_SHARE = 0.25


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_kv_budget_bytes(config: ModelConfig, dtype_bytes: int) -> int:
    """The KV budget when none is given (the rule in the module docstring)."""
    tokens = min(max(config.max_position_embeddings, MIN_TOKENS), MAX_TOKENS)
    budget = tokens * config.kv_bytes_per_token(dtype_bytes)
    free = available_memory_bytes()
    if free is not None:
        budget = min(budget, int(free * MEMORY_SHARE))
    return budget


def resident_bytes() -> tuple[int, int]:
    """(resident memory now, its peak) of this process, in bytes (VmRSS / VmHWM; the peak
    from getrusage where /proc is missing)."""
    now = peak = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                now = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if not peak:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return now or peak, peak
