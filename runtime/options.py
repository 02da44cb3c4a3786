"""The engine's options in one table: every `Engine(...)` keyword once (name, type, default,
group, help, choices) and the server's own flags beside them.

From `OPTIONS` come the command lines' flags and their help (`add_flags`: `python -m
runtime.server`, the replica flags `python -m runtime.cluster` passes on, the ranks' flags of
`python -m runtime.workers.launch`), a parsed command line's Engine keywords
(`engine_kwargs`), the check of `Engine`'s keywords (`check_keywords`: an unknown one is an
`UnknownOptionError` naming it) and the options page of the docs (`render_markdown`,
docs/configuration.md). The flag names are SGLang's; `Engine`'s own signature spells the same
names and defaults (a test holds the two equal). Its layer is below the workers' (whose
launcher takes its flags from here): it imports only errors, attention and memory.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.attention.kv_calibration import CHOICES as KV_CALIBRATION_CHOICES
from runtime.attention.registry import CHOICES as ATTENTION_CHOICES
from runtime.errors import UnknownOptionError
from runtime.memory.kv_pool import KV_DTYPE_CHOICES

_SAME: Any = object()  # "as the Engine's default" (for a flag's or a cluster flag's default)

# group -> the title `--help` shows (in this order)
GROUPS = {
    "server": "server (HTTP, this process)",
    "model": "model: weights, dtype, quantization",
    "cache": "KV cache: pool, pages, radix cache",
    "scheduling": "scheduling: batching, chunked prefill, overlap",
    "parallel": "parallelism (worker ranks joined by torch.distributed)",
    "pd": "prefill-decode disaggregation (behind the gateway's PD mode)",
    "storage": "hierarchical cache (a storage tier under the radix cache)",
    "device": "device: CPU threads, GPU, CUDA graphs, attention kernels",
    "speculative": "speculative decoding",
    "grammar": "constrained generation: JSON Schema, grammar compiles",
}


@dataclass(frozen=True)
class Option:
    """One option. `name` is the `Engine` keyword (and the parsed flag's attribute unless
    `dest` says otherwise); `engine=False`: a server-only flag. `flags` default to
    `--name-with-dashes`; `flag=False`: no flag of its own (`source` names the flag the
    server takes its value from). `invert`: the flag is a `--disable-...` switch of a keyword
    that defaults to True. `flag_default`: the flag's default where it differs from the
    keyword's; `cluster`: `python -m runtime.cluster` passes the flag on to every replica,
    with `cluster_default` (unset: the flag's default)."""

    name: str
    default: Any
    group: str
    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple[Any, ...] | None = None
    flags: tuple[str, ...] = ()
    dest: str | None = None
    engine: bool = True
    flag: bool = True
    source: str | None = None
    action: str | None = None
    nargs: str | None = None
    metavar: str | None = None
    invert: bool = False
    flag_default: Any = _SAME
    cluster: bool = False
    cluster_default: Any = _SAME

    @property
    def flag_names(self) -> tuple[str, ...]:
        return self.flags or ("--" + self.name.replace("_", "-"),)

    @property
    def attr(self) -> str:
        """The parsed command line's attribute holding this option's flag."""
        return self.dest or self.flag_names[-1].removeprefix("--").replace("-", "_")

    @property
    def parser_default(self) -> Any:
        if self.flag_default is not _SAME:
            return self.flag_default
        return False if self.action == "store_true" else self.default


def _o(name: str, default: Any, group: str, help: str, **kw: Any) -> Option:
    return Option(name, default, group, help, **kw)


OPTIONS: tuple[Option, ...] = (
    # ---- server-only flags ------------------------------------------------------------------
    _o("served_model_name", None, "server", "name in /v1/models (default: the folder's name)",
       engine=False),
    _o("host", "127.0.0.1", "server", "the address the HTTP server listens on", engine=False),
    _o("port", 30000, "server", "the HTTP server's port", type=int, engine=False),
    _o("api_key", None, "server", "require 'Authorization: Bearer KEY'", engine=False),
    _o("max_queue", 256, "server", "requests that may wait beside the running ones before 503",
       type=int, engine=False),
    _o("graceful_timeout", 10.0, "server",
       "seconds running requests get to finish after SIGTERM", type=float, engine=False),
    _o("log_level", "info", "server", "logging level (debug, info, warning, error)",
       engine=False),
    # ---- model ------------------------------------------------------------------------------
    _o("model", None, "model",
       "model folder, GGUF file or name (default: SmolLM2-135M-Instruct)", cluster=True),
    _o("dtype", "float32", "model", "weights' and activations' dtype (float32, bfloat16, ...)"),
    _o("quantization", None, "model",
       "quantize a safetensors folder's weights at load (GGUF block formats)",
       choices=("q8_0", "q4_0")),
    # ---- KV cache ---------------------------------------------------------------------------
    _o("mem_budget_gb", None, "cache",
       "GiB of KV pool (default: one full context, at most a quarter of free memory)",
       type=float),
    _o("max_total_tokens", None, "cache", "tokens the KV pool holds (wins over the budget)",
       type=int),
    _o("page_size", 16, "cache", "tokens per KV page", type=int),
    _o("enable_radix_cache", True, "cache",
       "share prompt prefixes' KV between requests (the radix cache)",
       flags=("--disable-radix-cache",), invert=True, action="store_true"),
    _o("kv_cache_dtype", "auto", "cache",
       "KV cache storage type: auto (the model's dtype), fp8_e4m3 / fp8_e5m2 (one byte per "
       "value, per-layer scales; half the bytes of bf16), bf16, fp16, fp32",
       choices=KV_DTYPE_CHOICES),
    _o("kv_calibration", "smooth", "cache",
       "an fp8 pool's scales: smooth (measured scales and offsets), scale (measured scales), "
       "none (scale 1.0); a checkpoint's own scales win", choices=KV_CALIBRATION_CHOICES),
    # ---- scheduling -------------------------------------------------------------------------
    _o("max_running_requests", 64, "scheduling", "requests decoded together at most",
       type=int),
    _o("chunked_prefill_tokens", 512, "scheduling",
       "prompt tokens prefilled per step at most (longer prompts go in chunks)", type=int),
    _o("overlap_schedule", None, "scheduling",
       "plan the next step while the model runs this one (default: $SGL_OVERLAP, else off)",
       action="optional_bool"),
    # ---- parallelism ------------------------------------------------------------------------
    _o("tp_size", 1, "parallel", "tensor parallel ranks (heads, MLP columns, vocabulary split)",
       type=int, flags=("--tp", "--tp-size"), dest="tp_size", cluster=True),
    _o("pp_size", 1, "parallel", "pipeline parallel stages (layers split)", type=int,
       flags=("--pp", "--pp-size"), dest="pp_size", cluster=True),
    _o("ep_size", 1, "parallel", "expert parallel ranks (MoE models: routed experts split)",
       type=int, flags=("--ep", "--ep-size"), dest="ep_size", cluster=True),
    _o("nnodes", 1, "parallel", "machines the ranks run on", type=int),
    _o("node_rank", 0, "parallel", "this machine (0 serves; others only run their ranks)",
       type=int, engine=False),
    _o("dist_init_addr", None, "parallel", "HOST:PORT of node 0's rendezvous"),
    # ---- prefill-decode disaggregation -------------------------------------------------------
    _o("disaggregation_mode", "null", "pd",
       "prefill: prefill each request with a bootstrap room and hand its KV over; decode: "
       "fetch a room's KV and decode; null: a plain server", choices=("null", "prefill", "decode")),
    _o("disaggregation_bootstrap_port", None, "pd",
       "prefill servers: the TCP port decode servers fetch KV from", type=int, flag_default=8998),
    _o("disaggregation_bootstrap_host", "0.0.0.0", "pd",
       "where a prefill server's bootstrap listens (the server: its --host)", flag=False,
       source="host"),
    _o("disaggregation_timeout_s", 120.0, "pd",
       "seconds a room may wait for its prefill or its decode server", type=float,
       flags=("--disaggregation-timeout",)),
    _o("disaggregation_transfer_backend", "tcp", "pd",
       "how pages move: tcp (frames on the bootstrap connection) or mooncake (Mooncake's "
       "transfer engine; both servers must use the same)", choices=("tcp", "mooncake"),
       cluster=True),
    _o("disaggregation_mooncake_protocol", "tcp", "pd",
       "the transport Mooncake's transfer engine uses (rdma where the cluster has it)",
       choices=("tcp", "rdma")),
    # ---- storage tier -----------------------------------------------------------------------
    _o("enable_hierarchical_cache", False, "storage",
       "write pages the radix cache evicts to storage and load them back on a later prefix "
       "match (they survive a restart of the same model)", action="store_true"),
    _o("hicache_storage_backend", "file", "storage",
       "file: a folder; mooncake: Mooncake Store (a running mooncake_master)",
       choices=("file", "mooncake")),
    _o("hicache_storage_backend_extra_config", None, "storage",
       "the backend's settings as JSON (or @FILE of JSON); mooncake: master_server_address, "
       "metadata_server, global_segment_size, local_buffer_size, protocol, device_name, "
       "local_hostname (else the MOONCAKE_* variables)"),
    _o("hicache_storage_dir", None, "storage",
       "the file backend's folder (default: $SGL_DSL_CACHE_DIR/hicache)"),
    _o("hicache_storage_budget_gb", 8.0, "storage",
       "bytes the tier may keep on disk; least recently used pages go first", type=float),
    _o("hicache_load_policy", "auto", "storage",
       "auto: load a stored prefix when measured cheaper than recomputing it; always",
       choices=("auto", "always")),
    # ---- device -----------------------------------------------------------------------------
    _o("device", "auto", "device",
       "auto (the GPU when CUDA is available, else the CPU), cpu, cuda or cuda:N",
       cluster=True, cluster_default=None),
    _o("num_threads", None, "device",
       "torch CPU threads (default: all, or one when measured faster)", type=int),
    _o("attention_backend", "auto", "device",
       "attention kernels: cpu (the planned fast CPU paths), torch (reference), triton (GPU "
       "kernels); auto picks cpu on a CPU, triton on a GPU", choices=ATTENTION_CHOICES),
    _o("disable_cuda_graph", False, "device",
       "on a GPU, run decode steps eagerly instead of replaying CUDA graphs",
       action="store_true"),
    _o("cuda_graph_bs", None, "device",
       "decode batch sizes captured as CUDA graphs (default 1 2 4 8, then every 8 up to "
       "--max-running-requests)", type=int, nargs="+"),
    # ---- speculative decoding ---------------------------------------------------------------
    _o("speculative_algorithm", None, "speculative",
       "NGRAM: drafts looked up in the request's own tokens; STANDALONE: a draft model "
       "(--speculative-draft-model-path) with the target's vocabulary",
       type=str.upper, choices=("NGRAM", "STANDALONE")),
    _o("speculative_num_draft_tokens", None, "speculative",
       "drafts verified per request and step (default 8)", type=int),
    _o("speculative_num_steps", None, "speculative",
       "depth of a draft chain (the drafts per step when the flag above is unset)", type=int),
    _o("speculative_ngram_min_match_window_size", None, "speculative",
       "NGRAM: the shortest suffix looked up", type=int),
    _o("speculative_ngram_max_match_window_size", None, "speculative",
       "NGRAM: the longest suffix looked up", type=int),
    _o("speculative_draft_model_path", None, "speculative",
       "STANDALONE's draft model: a folder or a GGUF file"),
    _o("speculative_disable_by_batch_size", None, "speculative",
       "no drafts in a step with more decoding requests than this (default 4)", type=int),
    _o("speculative_config", None, "speculative",
       'vLLM\'s JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 8}\''),
    # ---- constrained generation -------------------------------------------------------------
    _o("json_schema_mode", "strict", "grammar",
       "JSON-Schema generation: strict (objects emit only their declared properties, the "
       "default) or exact (the schema's own language); a request's json_schema_mode wins",
       choices=("strict", "exact")),
    _o("grammar_compile_timeout_s", None, "grammar",
       "seconds a constraint may take to compile (in a worker process) before the request is "
       "refused with a 400 (default 10)", type=float, flags=("--grammar-compile-timeout",)),
    _o("grammar_compile_memory_mb", None, "grammar",
       "memory a constraint's compile may take in its worker process (default 2048)", type=int),
)  # fmt: skip

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
ENGINE_OPTIONS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.engine)


def option(name: str) -> Option:
    return BY_NAME[name]


def check_keywords(owner: str, given: Mapping[str, Any]) -> None:
    """`UnknownOptionError` naming the first keyword of `given` that is not an Engine option
    (with the nearest names, when some are close)."""
    if not given:
        return
    known = [o.name for o in ENGINE_OPTIONS]
    for name in given:
        if name not in BY_NAME or not BY_NAME[name].engine:
            near = difflib.get_close_matches(name, known, n=3)
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            raise UnknownOptionError(f"{owner} got an unknown keyword {name!r}{hint}", name)


def add_flags(
    parser: argparse.ArgumentParser,
    options: Iterable[Option],
    *,
    cluster: bool = False,
    required: Sequence[str] = (),
    titles: Mapping[str, str] | None = None,
) -> dict[str, argparse._ArgumentGroup]:
    """Add each option's flag to `parser`, in a group per `group` (titles: GROUPS, or
    `titles`). `cluster`: the defaults a replica-forwarding flag has (`cluster_default`);
    `required`: option names whose flag must be given. Returns the groups made."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for opt in options:
        if not opt.flag:
            continue
        if opt.group not in groups:
            title = (titles or {}).get(opt.group) or GROUPS[opt.group]
            groups[opt.group] = parser.add_argument_group(title)
        groups[opt.group].add_argument(*opt.flag_names, **_argparse_kwargs(opt, cluster, required))
    return groups


def _argparse_kwargs(opt: Option, cluster: bool, required: Sequence[str]) -> dict[str, Any]:
    kw: dict[str, Any] = {"help": opt.help, "dest": opt.attr}
    if opt.name in required:
        kw["required"] = True
    else:
        default = opt.parser_default
        if cluster and opt.cluster_default is not _SAME:
            default = opt.cluster_default
        kw["default"] = default
    if opt.action == "store_true":
        kw["action"] = "store_true"
    elif opt.action == "optional_bool":
        kw["action"] = argparse.BooleanOptionalAction
    else:
        for key in ("type", "choices", "nargs", "metavar"):
            if getattr(opt, key) is not None:
                kw[key] = getattr(opt, key)
    return kw


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The Engine keywords a parsed server command line gives (every Engine option but
    `model`, which the server passes itself)."""
    out = {}
    for opt in ENGINE_OPTIONS:
        if opt.name == "model":
            continue
        value = getattr(args, opt.source or opt.attr)
        out[opt.name] = (not value) if opt.invert else value
    return out


def forwarded_flags(args: argparse.Namespace, names: Iterable[str]) -> list[str]:
    """`--flag=value` for each named option whose parsed value is not its cluster default
    (what `python -m runtime.cluster` passes on to every replica)."""
    out = []
    for name in names:
        opt = BY_NAME[name]
        value = getattr(args, opt.attr)
        default = opt.parser_default if opt.cluster_default is _SAME else opt.cluster_default
        if value is not None and value != default:
            out.append(f"{opt.flag_names[0]}={value}")
    return out


def _cell(value: Any) -> str:
    return "—" if value is None else f"`{value!r}`"


def render_markdown() -> str:
    """The options page's table (docs/configuration.md), one section per group."""
    lines = []
    for group, title in GROUPS.items():
        rows = [o for o in OPTIONS if o.group == group]
        lines += [f"#### {title}", "", "| `Engine(...)` keyword | server flag | default | "
                  "choices | what it does |", "|---|---|---|---|---|"]  # fmt: skip
        for o in rows:
            keyword = f"`{o.name}`" if o.engine else "(server only)"
            if o.flag:
                flag = " / ".join(f"`{f}`" for f in o.flag_names)
            else:
                flag = f"(from `--{o.source}`)"
            default = _cell(o.default)
            if o.flag and o.parser_default != o.default and not o.invert:
                default += f" (flag: {_cell(o.parser_default)})"
            choices = ", ".join(f"`{c}`" for c in o.choices) if o.choices else ""
            lines.append(f"| {keyword} | {flag} | {default} | {choices} | "
                         f"{o.help.replace('|', chr(92) + '|')} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


DOC_START, DOC_END = "<!-- options -->", "<!-- end options -->"


def doc_with_table(text: str) -> str:
    """`text` (docs/options.md) with the part between its markers replaced by the table.
    Rewrite the page: `python -c "import runtime.options as o; o.update_doc('docs/options.md')"`."""
    head, rest = text.split(DOC_START, 1)
    _, tail = rest.split(DOC_END, 1)
    return f"{head}{DOC_START}\n{render_markdown()}{DOC_END}{tail}"


def update_doc(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc_with_table(text))
