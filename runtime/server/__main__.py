"""`python -m runtime.server [--model PATH] [--host H] [--port P] [--api-key K] ...`

Starts one engine and serves it over HTTP. SIGTERM (or Ctrl-C) shuts down gracefully: new
requests get 503, running ones may finish for `--graceful-timeout` seconds and are then
cancelled, the engine stops, and the process exits 0.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from typing import Any

import uvicorn

from runtime.attention.registry import CHOICES as ATTENTION_CHOICES
from runtime.memory.kv_pool import KV_DTYPE_CHOICES
from runtime.server.app import build_state, create_app
from runtime.server.tools.reasoning import reasoning_parser_names
from runtime.server.tools.registry import ALIASES, PARSERS

logger = logging.getLogger("runtime.server")
SPECULATIVE_FLAGS = ("algorithm", "num_draft_tokens", "num_steps", "ngram_min_match_window_size",
                     "ngram_max_match_window_size", "draft_model_path", "disable_by_batch_size",
                     "config")  # fmt: skip
# how long a start waits for the grammar prebuild and the compile workers before it serves
CONSTRAINTS_READY_S = 120


def _compile_flags(engine: argparse._ArgumentGroup) -> None:
    engine.add_argument(
        "--grammar-compile-timeout",
        type=float,
        default=None,
        help="seconds a constraint may take to compile (in a worker process) before the "
        "request is refused with a 400 (default 10)",
    )
    engine.add_argument(
        "--grammar-compile-memory-mb",
        type=int,
        default=None,
        help="memory a constraint's compile may take in its worker process (default 2048)",
    )


def _device_flags(engine: argparse._ArgumentGroup) -> None:
    engine.add_argument(
        "--device",
        default="auto",
        help="auto (the GPU when CUDA is available, else the CPU), cpu, cuda or cuda:N",
    )
    engine.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="on a GPU, run decode steps eagerly instead of replaying CUDA graphs",
    )
    engine.add_argument(
        "--cuda-graph-bs",
        type=int,
        nargs="+",
        default=None,
        help="decode batch sizes captured as CUDA graphs (default 1 2 4 8, then every 8 up to "
        "--max-running-requests)",
    )


def _speculative_flags(p: argparse.ArgumentParser) -> None:
    """SGLang's speculative decoding flags, and vLLM's --speculative-config JSON in the same
    terms (runtime/speculative/config.py; off unless an algorithm or the JSON is given)."""
    spec = p.add_argument_group("speculative decoding")
    spec.add_argument(
        "--speculative-algorithm",
        default=None,
        type=str.upper,
        choices=("NGRAM", "STANDALONE"),
        help="NGRAM: drafts looked up in the request's own tokens; STANDALONE: a draft model "
        "(--speculative-draft-model-path) with the target's vocabulary",
    )
    spec.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        help="drafts verified per request and step (default 8)",
    )
    spec.add_argument(
        "--speculative-num-steps",
        type=int,
        default=None,
        help="depth of a draft chain (the drafts per step when the flag above is unset)",
    )
    spec.add_argument("--speculative-ngram-min-match-window-size", type=int, default=None)
    spec.add_argument("--speculative-ngram-max-match-window-size", type=int, default=None)
    spec.add_argument("--speculative-draft-model-path", default=None,
                      help="STANDALONE's draft model: a folder or a GGUF file")  # fmt: skip
    spec.add_argument(
        "--speculative-disable-by-batch-size",
        type=int,
        default=None,
        help="no drafts in a step with more decoding requests than this (default 4)",
    )
    spec.add_argument(
        "--speculative-config",
        default=None,
        help='vLLM\'s JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 8}\'',
    )


def _chat_flags(p: argparse.ArgumentParser) -> None:
    chat = p.add_argument_group("chat: templates, tool calls, reasoning")
    chat.add_argument(
        "--chat-template",
        default=None,
        metavar="FILE",
        help="a Jinja chat template file used instead of the model folder's",
    )
    chat.add_argument(
        "--tool-call-parser",
        default=None,
        metavar="NAME",
        help=f"the model's tool-call format: {', '.join(sorted(PARSERS))}; also "
        f"{', '.join(f'{a} ({t})' for a, t in sorted(ALIASES.items()))} "
        "(default: chosen from the chat template)",
    )
    chat.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help=f"separate a thinking model's reasoning: {', '.join(reasoning_parser_names())}",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m runtime.server", description=__doc__.split("\n")[2])
    p.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--served-model-name", default=None, help="name in /v1/models (folder name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument(
        "--max-queue",
        type=int,
        default=256,
        help="requests that may wait beside the running ones before 503",
    )
    p.add_argument(
        "--graceful-timeout",
        type=float,
        default=10.0,
        help="seconds running requests get to finish after SIGTERM",
    )
    p.add_argument("--log-level", default="info")
    engine = p.add_argument_group("engine")
    engine.add_argument("--mem-budget-gb", type=float, default=None)
    engine.add_argument(
        "--quantization",
        choices=["q8_0", "q4_0"],
        default=None,
        help="quantize a safetensors folder's weights at load (GGUF block formats)",
    )
    engine.add_argument("--max-total-tokens", type=int, default=None)
    engine.add_argument("--page-size", type=int, default=16)
    engine.add_argument("--dtype", default="float32")
    engine.add_argument("--disable-radix-cache", action="store_true")
    engine.add_argument("--max-running-requests", type=int, default=64)
    engine.add_argument("--chunked-prefill-tokens", type=int, default=512)
    engine.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    engine.add_argument(
        "--json-schema-mode",
        choices=("strict", "exact"),
        default="strict",
        help="JSON-Schema generation: strict (objects emit only their declared properties, "
        "the default) or exact (the schema's own language); a request's json_schema_mode wins",
    )
    engine.add_argument(
        "--attention-backend",
        choices=ATTENTION_CHOICES,
        default="auto",
        help="attention kernels: cpu (the planned fast CPU paths), torch (reference), triton "
        "(GPU kernels); auto picks cpu on a CPU, triton on a GPU",
    )
    engine.add_argument(
        "--kv-cache-dtype",
        choices=KV_DTYPE_CHOICES,
        default="auto",
        help="KV cache storage type: auto (the model's dtype), fp8_e4m3 / fp8_e5m2 (one byte "
        "per value, per-layer scales; half the bytes of bf16), bf16, fp16, fp32",
    )
    _chat_flags(p)
    _speculative_flags(p)
    _compile_flags(engine)
    _hicache_flags(p)
    _pd_flags(p)
    _device_flags(engine)
    par = p.add_argument_group("parallelism (worker ranks joined by torch.distributed)")
    par.add_argument(
        "--tp",
        "--tp-size",
        dest="tp_size",
        type=int,
        default=1,
        help="tensor parallel ranks (heads, MLP columns, vocabulary split)",
    )
    par.add_argument(
        "--pp",
        "--pp-size",
        dest="pp_size",
        type=int,
        default=1,
        help="pipeline parallel stages (layers split)",
    )
    par.add_argument(
        "--ep",
        "--ep-size",
        dest="ep_size",
        type=int,
        default=1,
        help="expert parallel ranks (MoE models: routed experts split)",
    )
    par.add_argument("--nnodes", type=int, default=1, help="machines the ranks run on")
    par.add_argument(
        "--node-rank",
        type=int,
        default=0,
        help="this machine (0 serves; others only run their ranks)",
    )
    par.add_argument("--dist-init-addr", default=None, help="HOST:PORT of node 0's rendezvous")
    return p.parse_args(argv)


def _pd_flags(p: argparse.ArgumentParser) -> None:
    pd = p.add_argument_group("prefill-decode disaggregation (behind the gateway's PD mode)")
    pd.add_argument(
        "--disaggregation-mode",
        choices=("null", "prefill", "decode"),
        default="null",
        help="prefill: prefill each request with a bootstrap room and hand its KV over; "
        "decode: fetch a room's KV and decode; null: a plain server",
    )
    pd.add_argument(
        "--disaggregation-bootstrap-port",
        type=int,
        default=8998,
        help="prefill servers: the TCP port decode servers fetch KV from",
    )
    pd.add_argument(
        "--disaggregation-transfer-backend",
        choices=("tcp", "mooncake"),
        default="tcp",
        help="how pages move: tcp (frames on the bootstrap connection) or mooncake (Mooncake's "
        "transfer engine; both servers must use the same)",
    )
    pd.add_argument(
        "--disaggregation-mooncake-protocol",
        choices=("tcp", "rdma"),
        default="tcp",
        help="the transport Mooncake's transfer engine uses (rdma where the cluster has it)",
    )
    pd.add_argument(
        "--disaggregation-timeout",
        type=float,
        default=120.0,
        help="seconds a room may wait for its prefill or its decode server",
    )


def _hicache_flags(p: argparse.ArgumentParser) -> None:
    tier = p.add_argument_group("hierarchical cache (a storage tier under the radix cache)")
    tier.add_argument(
        "--enable-hierarchical-cache",
        action="store_true",
        help="write pages the radix cache evicts to storage and load them back on a later "
        "prefix match (they survive a restart of the same model)",
    )
    tier.add_argument(
        "--hicache-storage-backend",
        choices=("file", "mooncake"),
        default="file",
        help="file: a folder; mooncake: Mooncake Store (a running mooncake_master)",
    )
    tier.add_argument(
        "--hicache-storage-backend-extra-config",
        default=None,
        help="the backend's settings as JSON (or @FILE of JSON); mooncake: "
        "master_server_address, metadata_server, global_segment_size, local_buffer_size, "
        "protocol, device_name, local_hostname (else the MOONCAKE_* variables)",
    )
    tier.add_argument(
        "--hicache-storage-dir",
        default=None,
        help="the file backend's folder (default: $SGL_DSL_CACHE_DIR/hicache)",
    )
    tier.add_argument(
        "--hicache-storage-budget-gb",
        type=float,
        default=8.0,
        help="bytes the tier may keep on disk; least recently used pages go first",
    )
    tier.add_argument(
        "--hicache-load-policy",
        choices=("auto", "always"),
        default="auto",
        help="auto: load a stored prefix when measured cheaper than recomputing it; always",
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "mem_budget_gb": args.mem_budget_gb,
        "quantization": args.quantization,
        "max_total_tokens": args.max_total_tokens,
        "page_size": args.page_size,
        "dtype": args.dtype,
        "enable_radix_cache": not args.disable_radix_cache,
        "max_running_requests": args.max_running_requests,
        "chunked_prefill_tokens": args.chunked_prefill_tokens,
        "num_threads": args.num_threads,
        "json_schema_mode": args.json_schema_mode,
        "attention_backend": args.attention_backend,
        "kv_cache_dtype": args.kv_cache_dtype,
        "device": args.device,
        "disable_cuda_graph": args.disable_cuda_graph,
        "cuda_graph_bs": args.cuda_graph_bs,
        "grammar_compile_timeout_s": args.grammar_compile_timeout,
        "grammar_compile_memory_mb": args.grammar_compile_memory_mb,
        "tp_size": args.tp_size,
        "pp_size": args.pp_size,
        "ep_size": args.ep_size,
        "nnodes": args.nnodes,
        "dist_init_addr": args.dist_init_addr,
        "disaggregation_mode": args.disaggregation_mode,
        "disaggregation_bootstrap_port": args.disaggregation_bootstrap_port,
        "disaggregation_bootstrap_host": args.host,
        "disaggregation_timeout_s": args.disaggregation_timeout,
        "disaggregation_transfer_backend": args.disaggregation_transfer_backend,
        "disaggregation_mooncake_protocol": args.disaggregation_mooncake_protocol,
        "enable_hierarchical_cache": args.enable_hierarchical_cache,
        "hicache_storage_backend": args.hicache_storage_backend,
        "hicache_storage_dir": args.hicache_storage_dir,
        "hicache_storage_budget_gb": args.hicache_storage_budget_gb,
        "hicache_load_policy": args.hicache_load_policy,
        "hicache_storage_backend_extra_config": args.hicache_storage_backend_extra_config,
        **{f"speculative_{k}": getattr(args, f"speculative_{k}") for k in SPECULATIVE_FLAGS},
    }


def read_chat_template(path: str | None) -> str | None:
    """The text of `--chat-template FILE` (an OSError names a missing file)."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


class GracefulServer(uvicorn.Server):
    """uvicorn's server, but a stop signal first closes admission and is not re-raised at the
    end (uvicorn re-raises it, which would make the exit status 143 instead of 0)."""

    def __init__(self, config: uvicorn.Config, on_stop: Any) -> None:
        super().__init__(config)
        self._on_stop = on_stop

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._on_stop()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from runtime import Engine
    from runtime.errors import EngineError

    if args.node_rank > 0:  # another machine of a multi-machine engine: its ranks only
        from runtime.default_model import default_model
        from runtime.device import resolve_device
        from runtime.workers.launch import run_node

        model = args.model or str(default_model())
        return run_node(model, args.tp_size, args.pp_size, args.ep_size, args.nnodes,
                        args.node_rank, args.dist_init_addr,
                        resolve_device(args.device).type)  # fmt: skip
    from runtime.server.tools.reasoning import ReasoningParserError, get_reasoning_parser
    from runtime.server.tools.registry import ToolParserError, get_parser

    try:
        if args.tool_call_parser:
            get_parser(args.tool_call_parser)
        if args.reasoning_parser:
            get_reasoning_parser(args.reasoning_parser)
        template = read_chat_template(args.chat_template)
    except (ToolParserError, ReasoningParserError, OSError) as exc:
        logger.error("%s", exc)
        return 2
    try:
        engine = Engine(model=args.model, **engine_kwargs(args))
    except (EngineError, FileNotFoundError, OSError, ValueError) as exc:
        logger.error("cannot start the engine: %s", exc)
        return 2
    if template is not None:
        engine.tokenizer.chat_template = template
    hooks = getattr(getattr(engine, "scheduler", None), "hooks", None)
    if hooks is not None:  # compile workers ready before the first constrained request
        started = time.monotonic()
        if hooks.wait_ready(CONSTRAINTS_READY_S):
            logger.info("constraints ready in %.1f s", time.monotonic() - started)
        else:
            logger.warning("the compile workers were not ready within %d s; constrained "
                           "requests wait for them", CONSTRAINTS_READY_S)  # fmt: skip
    state = build_state(
        engine,
        model_name=args.served_model_name,
        api_key=args.api_key,
        max_queue=args.max_queue,
        max_running=args.max_running_requests,
    )
    state.tool_parser = args.tool_call_parser
    state.reasoning_parser = args.reasoning_parser
    app = create_app(state)

    def stop_admitting() -> None:
        # running requests get most of the grace period, then end with finish_reason "abort"
        state.bridge.begin_drain(max(0.0, args.graceful_timeout - 1.0))

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.graceful_timeout,
        access_log=False,
    )
    server = GracefulServer(config, stop_admitting)
    try:
        server.run()
    finally:
        state.bridge.draining = True
        state.bridge.cancel_all()
        engine.shutdown()
    logger.info("server stopped")
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
