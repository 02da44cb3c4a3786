"""Every environment variable the runtime package reads, declared once: name, type, default and
what it does (the kinds are `grammar.settings`'). No other runtime module reads or writes the
environment (tests/project/test_layout.py checks it); docs/configuration.md lists them.

Each is read when `get()` is called: the switches of a hot path on every call (a test or an
operator may flip one in a running process), those of model loading once per load. The
native-code settings (`CC`, `SGL_NATIVE_CACHE`) are grammar's: `grammar/native_build.py` builds
the runtime's C kernels too.
"""

from __future__ import annotations

import os
from pathlib import Path

from grammar.settings import Choice, Flag, Folder, Setting, Text

OVERLAP = Flag(
    "SGL_OVERLAP",
    False,
    "Run each forward on a thread while the scheduler plans the next step, when "
    "`Engine(overlap_schedule=...)` is not given.",
)
KERNELS = Choice(
    "SGL_KERNELS",
    "auto",
    "Which kernels `runtime.kernels`' dispatch functions run (the kernel tests use them; an "
    "engine's model picks its kernels by `attention_backend`): `auto` (Triton for CUDA tensors "
    "when it imports, else the torch reference), or force `triton` / `torch`.",
    choices=("auto", "triton", "torch"),
)
FUSED_CPU = Flag(
    "SGL_FUSED_CPU",
    True,
    "The fused C kernels for a CPU model's small ops (RMSNorm with the residual add, rotary with "
    "the K/V write, decode attention); 0 keeps the torch ops.",
)
PREFIX_EXTEND = Flag(
    "SGL_PREFIX_EXTEND",
    True,
    "CPU extend attention split at the cached prefix (the prefix read once per group); 0 keeps "
    "the short-chunk path.",
)
CPU_GEMV = Flag(
    "SGL_CPU_GEMV",
    True,
    "Projections of up to 16 rows (decode steps of up to 16 requests) through the packed CPU "
    "matrix-vector kernel; 0 keeps oneDNN. Read at model load.",
)
PACKED_LINEAR = Flag(
    "SGL_PACKED_LINEAR",
    True,
    "CPU fp32 / bf16 weights reordered once for oneDNN at load; 0 keeps plain `F.linear`. Read "
    "at model load.",
)
ADAPTIVE_THREADS = Flag(
    "SGL_ADAPTIVE_THREADS",
    True,
    "Measure whether a CPU forward runs faster on all threads or on one, and keep measuring; 0 "
    "keeps all threads.",
)
GRAMMAR_PREBUILD = Flag(
    "SGL_GRAMMAR_PREBUILD",
    True,
    "Build the pieces every schema shares (format automata, the vocabulary's token tables) on "
    "the grammar thread when an engine starts; 0 leaves them to the first compile.",
)
CACHE_DIR = Folder(
    "SGL_DSL_CACHE_DIR",
    Path("~/.cache/sgl_dsl"),
    "Where the default model is converted to and loaded from (`models/` below it).",
)
TRITON_INTERPRET = Flag(
    "TRITON_INTERPRET",
    False,
    "Triton's own switch: run Triton kernels in its interpreter (how CPU tests run them); the "
    "runtime reads it to upcast bf16 dot operands the interpreter would misread.",
)
TOKENIZERS_PARALLELISM = Text(
    "TOKENIZERS_PARALLELISM",
    None,
    "The `tokenizers` library's switch; a worker rank sets it to `false` when unset.",
)
PYTHONPATH = Text(
    "PYTHONPATH",
    None,
    "Passed on to worker ranks with the repository root in front, so they import this code.",
)

# Mooncake Store, the `mooncake` backend of the storage tier: SGLang's variables, read when an
# engine starts; `hicache_storage_backend_extra_config` keys of the same meaning win over them
MOONCAKE_MASTER = Text(
    "MOONCAKE_MASTER",
    None,
    "The Mooncake master (`host:port`) of the `mooncake` storage tier when "
    "`hicache_storage_backend_extra_config` has no `master_server_address`.",
)
MOONCAKE_TE_META_DATA_SERVER = Text(
    "MOONCAKE_TE_META_DATA_SERVER",
    "P2PHANDSHAKE",
    "The `mooncake` storage tier's metadata server: `P2PHANDSHAKE` (none) or an "
    "`http://host:port/metadata` URL (extra-config key `metadata_server`).",
)
MOONCAKE_GLOBAL_SEGMENT_SIZE = Text(
    "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "1gb",
    "Memory the engine lends Mooncake Store for pages (bytes, or `512mb`, `4gb`); 0 when store "
    "services hold them (extra-config key `global_segment_size`).",
)
MOONCAKE_LOCAL_BUFFER_SIZE = Text(
    "MOONCAKE_LOCAL_BUFFER_SIZE",
    "64mb",
    "The Mooncake Store client's transfer buffer (extra-config key `local_buffer_size`).",
)
MOONCAKE_PROTOCOL = Text(
    "MOONCAKE_PROTOCOL",
    "tcp",
    "How the `mooncake` storage tier moves pages: `tcp` or `rdma` (extra-config key `protocol`).",
)
MOONCAKE_DEVICE = Text(
    "MOONCAKE_DEVICE",
    None,
    "RDMA devices of the `mooncake` storage tier, e.g. `mlx5_0` (extra-config key `device_name`).",
)
MOONCAKE_LOCAL_HOSTNAME = Text(
    "MOONCAKE_LOCAL_HOSTNAME",
    "localhost",
    "The address other Mooncake clients reach this engine's segment at (extra-config key "
    "`local_hostname`).",
)

SETTINGS: tuple[Setting, ...] = (
    OVERLAP,
    KERNELS,
    FUSED_CPU,
    PREFIX_EXTEND,
    CPU_GEMV,
    PACKED_LINEAR,
    ADAPTIVE_THREADS,
    GRAMMAR_PREBUILD,
    CACHE_DIR,
    TRITON_INTERPRET,
    TOKENIZERS_PARALLELISM,
    PYTHONPATH,
    MOONCAKE_MASTER,
    MOONCAKE_TE_META_DATA_SERVER,
    MOONCAKE_GLOBAL_SEGMENT_SIZE,
    MOONCAKE_LOCAL_BUFFER_SIZE,
    MOONCAKE_PROTOCOL,
    MOONCAKE_DEVICE,
    MOONCAKE_LOCAL_HOSTNAME,
)


def set_default(setting: Setting, value: str) -> None:
    """Give `setting` the value `value` in this process's environment unless it is set."""
    os.environ.setdefault(setting.name, value)


def child_environment(**changes: str) -> dict[str, str]:
    """This process's environment with `changes`, for a child process: settings pass on."""
    return {**os.environ, **changes}
