"""`Engine`: the in-process entry point (model + pool + radix cache + scheduler thread)."""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from grammar.constraint import FIELDS as CONSTRAINT_FIELDS
from runtime import settings
from runtime.attention import make_backend, resolve_backend
from runtime.attention.kv_calibration import KVCalibration, calibrate, kv_calibration_kind
from runtime.default_model import default_model
from runtime.device import ModelRunner, building_on, place_state, resolve_device
from runtime.disaggregation.modes import (
    BOOTSTRAP_KEYS,
    DEFAULT_TIMEOUT_S,
    Disaggregation,
    HandoffStream,
    Ticket,
    finish_room,
    model_fingerprint,
    split_bootstrap,
)
from runtime.errors import HiCacheConfigError, KVTransferError, ParallelConfigError
from runtime.kernels.cpu import fused as cpu_fused
from runtime.kernels.cpu.quant import QuantTensor
from runtime.memory.budget import default_kv_budget_bytes, resident_bytes
from runtime.memory.hicache import HiCache, parse_extra_config
from runtime.memory.kv_pool import (
    KVPool,
    checkpoint_kv_scales,
    kv_dtype_name,
    resolve_dtype,
    resolve_kv_dtype,
)
from runtime.memory.radix_cache import RadixCache
from runtime.memory.windows import pool_pages
from runtime.models.loader import load_model_files
from runtime.models.registry import model_class
from runtime.models.threads import ThreadChooser, chooser_wanted
from runtime.named_models import resolve_model
from runtime.options import check_keywords
from runtime.parallel.shard import local_config, validate
from runtime.scheduling import healing
from runtime.scheduling.compile_pool import CompilePool
from runtime.scheduling.constrained import ConstraintHooks
from runtime.scheduling.detokenize import Detokenizer, special_ids
from runtime.scheduling.request import GenerateResult, Request, SamplingParams
from runtime.scheduling.scheduler import Scheduler
from runtime.scheduling.stream import AsyncStreamIterator, LoopOutbox, StreamIterator
from runtime.speculative.config import (
    SpeculativeConfig,
    SpeculativeConfigError,
    speculative_config,
)
from runtime.speculative.draft_model import DraftModel
from runtime.speculative.speculator import Speculator
from runtime.workers.driver import ParallelModel
from runtime.workers.layout import Layout

logger = logging.getLogger(__name__)

Prompt = str | list[int]


def overlap_wanted(flag: bool | None) -> bool:
    """`overlap_schedule` if given, else $SGL_OVERLAP ("1" on, "0" off), else off."""
    if flag is not None:
        return flag
    return settings.OVERLAP.get()


def _eos_ids(loaded_source: Path, config_eos: Sequence[int], tokenizer) -> list[int]:
    ids = set(config_eos)
    gen = loaded_source / "generation_config.json" if loaded_source.is_dir() else None
    if gen is not None and gen.is_file():
        raw = json.loads(gen.read_text()).get("eos_token_id")
        ids.update([raw] if isinstance(raw, int) else raw or [])
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


# Engines not shut down by the program are shut down at exit, before the interpreter finalizes:
# a daemon scheduler thread caught inside a native op (a matmul, an OpenMP kernel) when Python
# finalizes is unwound by pthread_exit through C++ frames, which aborts the process
# ("terminate called without an active exception") after the program itself has finished.
_LIVE_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _shutdown_live_engines() -> None:
    for engine in list(_LIVE_ENGINES):
        try:
            engine.shutdown()
        except Exception:  # at exit: a failing shutdown must not stop the others
            logger.warning("engine shutdown at exit failed", exc_info=True)


def _num_pages(
    config: Any,
    dtype: torch.dtype,
    page_size: int,
    max_total_tokens: int | None,
    mem_budget_gb: float | None,
    chunk_tokens: int,
    separate_windows: bool,
) -> tuple[int, int | None]:
    """KV pages (and window pages, or None: memory/windows.py): for `max_total_tokens`, else
    for `mem_budget_gb` of KV, else for the default budget (runtime/memory/budget.py: one full
    context, at most a quarter of free memory)."""
    dtype_bytes = torch.finfo(dtype).bits // 8
    budget = (
        mem_budget_gb * 1024**3 if mem_budget_gb else default_kv_budget_bytes(config, dtype_bytes)
    )
    return pool_pages(
        config, page_size, dtype_bytes, chunk_tokens, budget_bytes=int(budget),
        max_total_tokens=max_total_tokens, separate_windows=separate_windows,
    )  # fmt: skip


def _speculative(given: dict[str, Any]) -> SpeculativeConfig | None:
    """The Engine's `speculative_*` keywords, by name, in one record (None: speculation off)."""
    kw = {k.removeprefix("speculative_"): v for k, v in given.items()}
    vllm = kw.pop("config")
    return speculative_config(
        kw.pop("algorithm"),
        **kw,
        vllm_config=dict(vllm) if isinstance(vllm, Mapping) else vllm,
    )


def _rank_config(config: Any, tp_size: int, pp_size: int, ep_size: int) -> Any:
    """The shape one rank holds: the KV budget is per rank (its layers' and heads' KV)."""
    if (tp_size, pp_size, ep_size) == (1, 1, 1):
        return config
    return local_config(config, Layout(tp_size, pp_size, ep_size, config.num_layers).shard(1))


def _make_hicache(
    pool: KVPool,
    tree: RadixCache | None,
    fingerprint: str,
    backend: str,
    folder: str | Path | None,
    budget_gb: float,
    load_policy: str,
    extra_config: str | Mapping[str, Any] | None,
) -> HiCache:
    """The storage tier under the radix cache (memory/hicache.py), its settings checked, hooked
    to the tree's evictions."""
    if tree is None or not pool.buffers.get(next(iter(pool.buffers), ""), []):
        raise HiCacheConfigError(
            "enable_hierarchical_cache needs the radix cache and the KV pool in this process "
            "(not with disable_radix_cache or tp/pp/ep > 1)"
        )
    if budget_gb <= 0:
        raise HiCacheConfigError(f"hicache_storage_budget_gb must be positive, got {budget_gb}")
    root = Path(folder) if folder is not None else settings.CACHE_DIR.get() / "hicache"
    try:
        tier = HiCache(pool, fingerprint, str(root), int(budget_gb * 1024**3), backend=backend,
                       load_policy=load_policy, extra=parse_extra_config(extra_config))  # fmt: skip
    except HiCacheConfigError:
        raise
    except OSError as exc:
        raise HiCacheConfigError(f"hicache_storage_dir {str(root)!r} is not usable: {exc}") from exc
    except ValueError as exc:
        raise HiCacheConfigError(str(exc)) from exc
    tree.on_evict = tier.on_evict
    return tier


def _local_model(loaded: Any, engine: Engine, quantization: str | None) -> Any:
    """A one-process engine's model, built on its device (on the CPU: from the loaded tensors
    themselves; a GGUF's block-quantized weights are dequantized for a GPU)."""
    device = engine.device
    if quantization and device.type != "cpu":
        raise ValueError(f"quantization {quantization!r} runs on the CPU only, not on {device}")
    state = place_state(loaded.state_dict, device)
    with building_on(device):
        return model_class(loaded.config)(
            loaded.config, state, engine.dtype, attention=make_backend(engine.attention_backend)
        )


def _local_runner(
    model: Any, pool: KVPool, device: torch.device, num_threads: int | None,
    disable_cuda_graph: bool, cuda_graph_bs: Sequence[int] | None, max_running: int,
) -> ModelRunner:  # fmt: skip
    """A one-process engine's runner; its thread choice (all threads or one, measured) on a
    CPU when the thread count was not given."""
    chooser = ThreadChooser() if chooser_wanted(num_threads, device) else None
    return ModelRunner.local(model, pool, device, chooser=chooser,
                             disable_cuda_graph=disable_cuda_graph, batch_sizes=cuda_graph_bs,
                             max_running=max_running)  # fmt: skip


class Engine:
    """A causal LM served from a paged KV pool with a radix prefix cache.

    Thread-safe: every public method may be called from any thread; the model runs on one
    background scheduler thread that batches whatever requests are in flight.

    `device`: "auto" (the default: the current GPU when `torch.cuda.is_available()`, else the
    CPU), "cpu", "cuda" or "cuda:N" (runtime/device/; a parallel engine's ranks take
    `cuda:<local rank>` each). On a GPU, decode steps replay CUDA graphs captured at start-up
    for the batch sizes `cuda_graph_bs` (default 1, 2, 4, 8, then every 8 up to
    `max_running_requests`) unless `disable_cuda_graph`; on the CPU, giving `cuda_graph_bs`
    runs decode steps through the same padded static buffers eagerly (the graphs'
    bookkeeping, checked without a GPU).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        mem_budget_gb: float | None = None,
        page_size: int = 16,
        dtype: str = "float32",
        enable_radix_cache: bool = True,
        max_running_requests: int = 64,
        chunked_prefill_tokens: int = 512,
        max_total_tokens: int | None = None,
        num_threads: int | None = None,
        tp_size: int = 1,
        pp_size: int = 1,
        ep_size: int = 1,
        nnodes: int = 1,
        dist_init_addr: str | None = None,
        json_schema_mode: str = "strict",
        grammar_compile_timeout_s: float | None = None,
        grammar_compile_memory_mb: int | None = None,
        overlap_schedule: bool | None = None,
        disaggregation_mode: str = "null",
        disaggregation_bootstrap_port: int | None = None,
        disaggregation_bootstrap_host: str = "0.0.0.0",
        disaggregation_timeout_s: float = DEFAULT_TIMEOUT_S,
        disaggregation_transfer_backend: str = "tcp",
        disaggregation_mooncake_protocol: str = "tcp",
        attention_backend: str = "auto",
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
        enable_hierarchical_cache: bool = False,
        hicache_storage_backend: str = "file",
        hicache_storage_dir: str | Path | None = None,
        hicache_storage_budget_gb: float = 8.0,
        hicache_load_policy: str = "auto",
        hicache_storage_backend_extra_config: str | Mapping[str, Any] | None = None,
        device: str = "auto",
        disable_cuda_graph: bool = False,
        cuda_graph_bs: Sequence[int] | None = None,
        kv_calibration: str = "smooth",
        speculative_algorithm: str | None = None,
        speculative_num_draft_tokens: int | None = None,
        speculative_num_steps: int | None = None,
        speculative_ngram_min_match_window_size: int | None = None,
        speculative_ngram_max_match_window_size: int | None = None,
        speculative_draft_model_path: str | None = None,
        speculative_disable_by_batch_size: int | None = None,
        speculative_config: str | Mapping[str, Any] | None = None,
        **unknown: Any,
    ) -> None:
        check_keywords("Engine", unknown)  # not in runtime/options.py's table: named
        self.device = resolve_device(device)  # DeviceUnavailableError before any loading
        # speculative decoding (runtime/speculative): the speculative_* keywords (SGLang's, and
        # vLLM's dict); None: off. Checked before any loading (the error names the option).
        self.speculative = _speculative({k: v for k, v in locals().items() if "speculative_" in k})
        self.json_schema_mode = json_schema_mode  # default of requests with a json_schema
        # a constraint's compile budget (time, address space; None: compile_pool's defaults)
        self.grammar_compile_timeout_s, self.grammar_compile_memory_mb = (
            grammar_compile_timeout_s, grammar_compile_memory_mb)  # fmt: skip
        if num_threads:
            torch.set_num_threads(num_threads)
        # a name such as "gemma3-270m" is converted once from its package (named_models.py)
        path = resolve_model(model) if model is not None else default_model()
        if quantization and (tp_size, pp_size, ep_size) != (1, 1, 1):
            raise ParallelConfigError(f"quantization {quantization!r} with tp/pp/ep > 1")
        loaded = load_model_files(path, quantization)
        self.model_path = path
        self.config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.dtype = resolve_dtype(dtype)
        self.kv_dtype = resolve_kv_dtype(kv_cache_dtype, self.dtype)  # "auto": the model's
        self.attention_backend = resolve_backend(attention_backend, self.device)  # auto: cpu/triton
        self.parallel = (tp_size, pp_size, ep_size) != (1, 1, 1)
        if nnodes > 1 and not self.parallel:
            raise ParallelConfigError(f"nnodes {nnodes} needs tp_size, pp_size or ep_size > 1")
        if self.parallel:
            validate(self.config, tp_size, pp_size, ep_size)
        rank_config = _rank_config(self.config, tp_size, pp_size, ep_size)
        # sliding-window layers keep pages of their own (memory/windows.py) unless ranks, a
        # KV hand-off or the storage tier address every layer by page id
        plain = not self.parallel and disaggregation_mode == "null"
        num_pages, window_pages = _num_pages(
            rank_config, self.kv_dtype, page_size, max_total_tokens, mem_budget_gb,
            chunked_prefill_tokens, plain and not enable_hierarchical_cache,
        )  # fmt: skip
        self.model_fingerprint = model_fingerprint(loaded.config, loaded.state_dict)
        calibration = self._kv_calibration(kv_calibration, loaded)
        quantized = any(isinstance(t, QuantTensor) for t in loaded.state_dict.values())
        if self.parallel:
            del loaded  # each worker loads its own shard
            driver = ParallelModel(
                path, self.config, self.dtype, tp_size=tp_size, pp_size=pp_size,
                ep_size=ep_size, num_pages=num_pages, page_size=page_size, nnodes=nnodes,
                dist_init_addr=dist_init_addr, attention_backend=self.attention_backend,
                kv_dtype=self.kv_dtype, device=self.device.type, kv_calibration=calibration)
        else:
            model = _local_model(loaded, self, quantization)
            del loaded
        self.sizes = {"tp_size": tp_size, "pp_size": pp_size, "ep_size": ep_size}
        self.pool = KVPool(self.config, num_pages, page_size, self.kv_dtype, **calibration.kwargs(),
                           allocate=not self.parallel, window_pages=window_pages,
                           device="cpu" if self.parallel else self.device)  # fmt: skip
        # the one owner of the model at run time (device/runner.py): the scheduler calls it
        self.runner = ModelRunner.parallel(driver, self.device) if self.parallel else _local_runner(
            model, self.pool, self.device, num_threads, disable_cuda_graph, cuda_graph_bs,
            max_running_requests)  # fmt: skip
        self.tree = RadixCache(page_size, self.pool.free) if enable_radix_cache else None
        self.hicache = _make_hicache(
            self.pool, self.tree, self.model_fingerprint, hicache_storage_backend,
            hicache_storage_dir, hicache_storage_budget_gb, hicache_load_policy,
            hicache_storage_backend_extra_config,
        ) if enable_hierarchical_cache else None  # fmt: skip
        self.disaggregation = Disaggregation(
            disaggregation_mode, None if self.parallel else self.pool, self.model_fingerprint,
            bootstrap_host=disaggregation_bootstrap_host, timeout_s=disaggregation_timeout_s,
            bootstrap_port=disaggregation_bootstrap_port,
            transfer_backend=disaggregation_transfer_backend,
            mooncake_protocol=disaggregation_mooncake_protocol)  # fmt: skip
        self._start(path, max_running_requests, chunked_prefill_tokens, overlap_schedule, quantized)

    @property
    def model(self) -> Any:
        """The model this process holds (a parallel engine: the driver of its worker ranks).
        Read-only: it runs through `self.runner` (device/runner.py), which owns it."""
        return self.runner.model

    def _start(
        self, path: Path, max_running: int, chunk_tokens: int, overlap: bool | None, quantized: bool
    ) -> None:
        """The parts after the model and the pool: outputs, the scheduler thread."""
        self.eos_token_ids = _eos_ids(path, self.config.eos_token_ids, self.tokenizer)
        # the prefill or decode role, consulted only for requests that carry a room
        self._role = self.disaggregation if self.disaggregation.mode != "null" else None
        self.detokenizer = Detokenizer(self.tokenizer, self.eos_token_ids)
        self.scheduler = self._make_scheduler(max_running, chunk_tokens, overlap_wanted(overlap))
        self._free_loading_threads(quantized)
        self._closed = False
        _LIVE_ENGINES.add(self)  # shut down at exit if the program never closes it
        self._log_ready()

    def _free_loading_threads(self, quantized: bool) -> None:
        """This thread's OpenMP team (from loading) would make libgomp stop spinning the
        scheduler thread's: free it (cpu_fused.release_openmp_team). Quantized weights run on
        the quantized kernels' own pool, beside which a spinning OpenMP worker only takes a
        core away: there this thread keeps a team of torch's size, so that libgomp's workers
        spin briefly (cpu_fused.hold_openmp_team); dense weights choose it per step (the runner's
        `choose_waits_per_step`: brief after decode steps, long after prompts)."""
        if not self.parallel and self.device.type == "cpu" and cpu_fused.available(torch.float32):
            cpu_fused.release_openmp_team()
            if quantized:
                cpu_fused.hold_openmp_team()
            else:
                self.runner.choose_waits_per_step()

    def _log_ready(self) -> None:
        logger.info(
            "engine ready: %s, weights %.1f MiB as stored, KV pool %.1f MiB reserved (%d tokens, "
            "%d bytes/token; %s resident), process resident %.1f MiB",
            self.model_path,
            self.runner.weight_bytes() / 2**20,
            self.pool.capacity_tokens * self.pool.bytes_per_token / 2**20,
            self.pool.capacity_tokens,
            self.pool.bytes_per_token,
            "workers'" if self.parallel else f"{self.pool.resident_bytes() / 2**20:.1f} MiB",
            resident_bytes()[0] / 2**20,
        )

    def _make_scheduler(self, max_running: int, chunk_tokens: int, overlap: bool) -> Scheduler:
        return Scheduler(
            self.runner,
            self.pool,
            self.tree,
            self.detokenizer,
            max_running=max_running,
            chunk_tokens=chunk_tokens,
            hooks=self._make_constraint_hooks(),
            overlap=overlap and not self.parallel,
            tier=self.hicache,
            speculation=self._speculator(),
        )

    def _speculator(self) -> Speculator | None:
        """Speculative decoding's hook (None: off); STANDALONE loads its draft model here, with
        a KV pool of as many pages as the target's (reserved, resident as used)."""
        if self.speculative is None:
            return None
        draft = None
        if self.speculative.algorithm == "STANDALONE":
            if self.parallel:
                raise SpeculativeConfigError(
                    "speculative_algorithm 'STANDALONE' runs in a one-process engine only "
                    "(tp_size, pp_size and ep_size 1)"
                )
            draft = DraftModel.load(
                self.speculative.draft_model_path, target_tokenizer=self.tokenizer,
                target_vocab=self.config.vocab_size, dtype=self.dtype, device=self.device,
                attention_backend=self.attention_backend, num_pages=self.pool.num_pages,
                page_size=self.pool.page_size,
            )  # fmt: skip
        return Speculator(self.speculative, draft)

    def _kv_calibration(self, requested: str, loaded: Any) -> KVCalibration:
        """The pool's scales and offsets; sets `kv_calibration` (what they are). "smooth" /
        "scale": measured on a model of its own built from `loaded` (so a one-process engine
        and a parallel one, whose ranks keep their shares, get the same numbers) over the
        shipped text (attention/kv_calibration.py); else the checkpoint's scales (or none)."""
        scales = checkpoint_kv_scales(loaded.state_dict, self.config.num_layers)
        self.kv_calibration = kv_calibration_kind(self.kv_dtype, requested, scales)
        if self.kv_calibration in ("smooth", "scale") and self.device.type != "cpu":
            # the calibration pass runs the model on the CPU only
            logger.warning("kv_calibration %r runs on the CPU only: unit scales on %s",
                           self.kv_calibration, self.device)  # fmt: skip
            self.kv_calibration = "none"
        if self.kv_calibration not in ("smooth", "scale"):
            return KVCalibration(scales, {})
        model = model_class(loaded.config)(loaded.config, loaded.state_dict, self.dtype)
        return calibrate(model, self.config, self.tokenizer, self.dtype, self.kv_dtype,
                         smooth=self.kv_calibration == "smooth")  # fmt: skip

    @property
    def compile_pool(self) -> CompilePool:
        """The constraint compile pool (worker processes, budgets, cache) this engine's
        requests compile in; the server is handed it (`runtime.server.app.build_state`)."""
        return self.scheduler.hooks.compiles

    def _make_constraint_hooks(self) -> ConstraintHooks:
        # constrained rows' logits are masked by the attention backend's bitmask kernel
        return ConstraintHooks(
            self.tokenizer,
            self.eos_token_ids,
            json_schema_mode=self.json_schema_mode,
            compile_timeout_s=self.grammar_compile_timeout_s,
            compile_memory_mb=self.grammar_compile_memory_mb,
            apply_token_bitmask_=make_backend(self.attention_backend).apply_token_bitmask_,
        )

    # ---- requests ----------------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: text exactly as `tokenizer(text)` encodes it."""
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt).input_ids)
        ids = [int(t) for t in prompt]
        if any(t < 0 or t >= self.config.vocab_size for t in ids):
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size})")
        return ids

    def _make_request(self, prompt: Prompt, kw: dict[str, Any], stream: bool) -> Request:
        # the output constraint, read once into a grammar.Constraint (ConstraintError, a
        # ValueError naming the field: two kinds, an unknown dtype or json_schema_mode)
        constraint_kw = {k: kw.pop(k) for k in CONSTRAINT_FIELDS if k in kw}
        jump_forward = kw.pop("jump_forward", True)
        constraint = self.scheduler.hooks.constraint_of(constraint_kw)
        heal = kw.pop("token_healing", False)
        if not isinstance(heal, bool):
            raise ValueError(f"token_healing must be true or false, got {heal!r}")
        stop = kw.pop("stop", None)
        kw["stop"] = (stop,) if isinstance(stop, str) else tuple(stop or ())
        kw["stop_token_ids"] = frozenset(kw.pop("stop_token_ids", None) or ())
        kw["keep_markers"] = tuple(kw.pop("keep_markers", None) or ())
        if kw.get("logit_bias"):
            kw["logit_bias"] = self._logit_bias(kw["logit_bias"])
        params = SamplingParams(**kw)
        ids = self.encode(prompt)
        if not ids:
            raise ValueError("empty prompt")
        healed = None
        if heal and params.max_new_tokens > 0:
            ids, healed = healing.back_off(ids, self._healing_table())
        req = Request(ids, params, stream=stream)
        if constraint is not None:
            wake = lambda: self.scheduler.inbox.put(("wake", None))
            self.scheduler.hooks.attach(req, constraint, jump_forward=jump_forward, wake=wake)
        if healed is not None:
            healing.attach(req, healed, self.scheduler.hooks.vocab())
        return req

    def _healing_table(self) -> healing.HealingTable:
        """Token healing's index of the constraint vocabulary (built on first use); the
        tokenizer's special tokens, call and reasoning markers included, never heal."""
        return healing.HealingTable.for_vocab(
            self.scheduler.hooks.vocab(), special_ids(self.tokenizer)
        )

    def _logit_bias(self, raw: dict[Any, float]) -> dict[int, float]:
        """OpenAI's `logit_bias` with integer ids checked against the vocabulary."""
        bias = {int(t): float(v) for t, v in raw.items()}
        size = self.config.vocab_size
        bad = [t for t in bias if not 0 <= t < size]
        if bad:
            raise ValueError(f"logit_bias: token id {bad[0]} is not in [0, {size})")
        return bias

    def generate(
        self,
        prompt: Prompt | Sequence[Prompt],
        *,
        stream: bool = False,
        **sampling: Any,
    ) -> GenerateResult | list[GenerateResult] | StreamIterator:
        """Generate for one prompt (text or token ids) or a list of them.

        Keyword arguments are `SamplingParams` fields (`logit_bias`: token id -> bias in
        [-100, 100]) plus one constraint: `regex`, `json_schema`, `choices`, `dtype`, `grammar`
        (lark text), `ebnf` (GBNF text) or `structural_tag` (XGrammar's or SGLang's shape);
        `jump_forward`, `json_schema_mode` ("strict", the default: objects emit only their
        declared properties; "exact"), `whitespace_pattern` (a regex between JSON tokens; none:
        compact), `token_healing` (default False: when the prompt ends inside what the
        tokenizer would merge with what follows, its last tokens are backed off and the output's
        first tokens made to spell them (counted in max_new_tokens), left out of the text; see
        `runtime.scheduling.healing`), and on a prefill or
        decode server `bootstrap_host` / `bootstrap_port` / `bootstrap_room` (one prompt; see
        `runtime.disaggregation`). One prompt whose request is invalid raises; in a list, that
        entry comes back with finish_reason "abort" and `.error` set while the others go on.
        """
        if isinstance(prompt, Sequence) and not isinstance(prompt, str) and len(prompt) == 0:
            return []  # an empty batch
        single = isinstance(prompt, str) or isinstance(prompt[0], int)
        sampling = dict(sampling)
        boot = None  # the role is consulted only for a request that carries a room
        if any(key in sampling for key in BOOTSTRAP_KEYS):
            if self._role is None:  # a plain server serves such a request as any other
                for key in BOOTSTRAP_KEYS:
                    sampling.pop(key, None)
            else:
                boot = split_bootstrap(sampling)
        if boot is not None and not single:
            raise ValueError("bootstrap_room takes one prompt")
        if boot is not None and sampling.get("token_healing"):
            raise ValueError("token_healing: not with bootstrap_room (the prefill server would "
                             "sample the healing token unmasked)")  # fmt: skip
        if stream:
            if not single:
                raise ValueError("stream=True takes one prompt")
            req = self._make_request(prompt, dict(sampling), stream=True)  # type: ignore[arg-type]
            ticket = self._submit(req, boot)
            it = StreamIterator(req, self.scheduler.abort)
            return it if ticket is None else HandoffStream(it, ticket)  # type: ignore[return-value]
        if single:
            req = self._make_request(prompt, dict(sampling), stream=False)  # type: ignore[arg-type]
            ticket = self._submit(req, boot)
            result: GenerateResult = req.outbox.get()
            if ticket is not None:
                finish_room(ticket, result)
                if result.finish_reason == "abort":
                    raise KVTransferError(result.error)
            if req.error is not None and result.finish_reason == "abort":
                raise req.error
            return result
        reqs: list[Request | GenerateResult] = []
        for p in prompt:  # type: ignore[union-attr]
            try:
                req = self._make_request(p, dict(sampling), stream=False)
            except Exception as exc:
                reqs.append(GenerateResult("", [], [], "abort", error=f"{type(exc).__name__}: "
                                           f"{exc}"))  # fmt: skip
                continue
            self.scheduler.submit(req)
            reqs.append(req)
        return [r if isinstance(r, GenerateResult) else r.outbox.get() for r in reqs]

    def _submit(self, req: Request, boot: dict[str, Any] | None) -> Ticket | None:
        """Hand `req` to the scheduler; with a bootstrap room, as this server's role says."""
        d = self._role
        if boot is None or d is None:
            self.scheduler.submit(req)
            return None
        if d.mode == "prefill":
            ticket = d.attach_prefill(req, boot)
            self.scheduler.submit(req)
            return ticket
        if d.submit_decode(req, boot, self.scheduler.submit, self.scheduler.wake):
            return None  # submitted once its KV has arrived
        self.scheduler.submit(req)
        return None

    def score(
        self,
        prompt: Prompt,
        continuations: Sequence[Prompt],
        return_token_logprobs: bool = False,
    ) -> list[float] | list[list[float]]:
        """Log-likelihood of each continuation after `prompt`, in one batched call.

        The prompt is encoded as `generate` encodes it; a text continuation is encoded on its
        own (`add_special_tokens=False`) and appended, so every continuation shares the prompt's
        KV (computed once, through the radix cache).
        """
        reqs = self._score_requests(prompt, continuations)
        for req in reqs:
            self.scheduler.submit(req)
        out: list = []
        for req in reqs:
            result: GenerateResult = req.outbox.get()
            if req.error is not None:
                raise req.error
            lps = result.prompt_logprobs or []
            out.append(lps if return_token_logprobs else float(sum(lps)))
        return out

    def _score_requests(self, prompt: Prompt, continuations: Sequence[Prompt]) -> list[Request]:
        """One prefill-only request per continuation, scoring it after `prompt` (unsubmitted)."""
        prompt_ids = self.encode(prompt)
        if not prompt_ids:
            raise ValueError("score needs a non-empty prompt")
        reqs = []
        for cont in continuations:
            cont_ids = (
                list(self.tokenizer(cont, add_special_tokens=False).input_ids)
                if isinstance(cont, str)
                else self.encode(cont)
            )
            params = SamplingParams(max_new_tokens=0)
            reqs.append(Request(prompt_ids + cont_ids, params, logprob_start=len(prompt_ids)))
        return reqs

    # ---- asyncio ---------------------------------------------------------------------------
    async def async_generate(
        self, prompt: Prompt, *, stream: bool = False, **sampling: Any
    ) -> GenerateResult | AsyncStreamIterator:
        """`generate` for one prompt, awaited on the running loop without a thread of its own:
        the scheduler thread hands the result (or each chunk, with `stream=True`: an
        `AsyncStreamIterator`) straight to the loop. Same keywords; no bootstrap room. An
        invalid request raises here; a cancelled await aborts the request."""
        sampling = dict(sampling)
        if any(key in sampling for key in BOOTSTRAP_KEYS):
            if self._role is not None:
                raise ValueError("async_generate takes no bootstrap_room here; use generate")
            for key in BOOTSTRAP_KEYS:  # a plain server serves such a request as any other
                sampling.pop(key, None)
        req = self._make_request(prompt, sampling, stream=stream)
        outbox = req.outbox = LoopOutbox(asyncio.get_running_loop())
        self.scheduler.submit(req)
        if stream:
            return AsyncStreamIterator(req, outbox, self.scheduler.abort)
        try:
            result: GenerateResult = await outbox.queue.get()
        except asyncio.CancelledError:
            self.scheduler.abort(req)
            raise
        if req.error is not None and result.finish_reason == "abort":
            raise req.error
        return result

    async def async_score(
        self,
        prompt: Prompt,
        continuations: Sequence[Prompt],
        return_token_logprobs: bool = False,
    ) -> list[float] | list[list[float]]:
        """`score`, awaited on the running loop without a thread of its own."""
        loop = asyncio.get_running_loop()
        reqs = self._score_requests(prompt, continuations)
        for req in reqs:
            req.outbox = LoopOutbox(loop)
            self.scheduler.submit(req)
        out: list = []
        try:
            for req in reqs:
                result: GenerateResult = await req.outbox.queue.get()
                if req.error is not None:
                    raise req.error
                lps = result.prompt_logprobs or []
                out.append(lps if return_token_logprobs else float(sum(lps)))
        except asyncio.CancelledError:
            for req in reqs:
                self.scheduler.abort(req)
            raise
        return out

    # ---- maintenance -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return self.scheduler.call(self._stats)

    def _stats(self) -> dict[str, Any]:
        s = self.scheduler
        c = dict(s.counters)
        ps = self.pool.page_size
        used = self.pool.num_usable_pages - self.pool.num_free_pages
        served = c["prefill_cached"] + c["prefill_computed"]
        resident, peak = resident_bytes()
        run = self.runner.stats()
        return {
            "model": str(self.model_path),
            "dtype": str(self.dtype).replace("torch.", ""),
            "device": str(self.device),
            # decode batch sizes replayed through static buffers (CUDA graphs on a GPU)
            "cuda_graph_batch_sizes": list(run.graph_batch_sizes),
            "graph_replays": run.graph_replays,
            # memory: weights as stored (quantized: their blocks), the KV pool, the process
            "weight_bytes": self.runner.weight_bytes(),
            "kv_pool_bytes": self.pool.capacity_tokens * self.pool.bytes_per_token,
            # of the pool's storage, what the system holds now (it becomes resident page by
            # page as it is written; None: the workers of a parallel engine hold it)
            "kv_pool_resident_bytes": None if self.parallel else self.pool.resident_bytes(),
            "resident_bytes": resident,
            "peak_resident_bytes": peak,
            "attention_backend": self.attention_backend,
            "kv_cache_dtype": kv_dtype_name(self.pool.dtype),
            "kv_calibration": self.kv_calibration,
            "page_size": ps,
            "num_pages": self.pool.num_usable_pages,
            "kv_bytes_per_token": self.pool.bytes_per_token,
            "kv_bytes_per_token_per_rank": self.runner.kv_bytes_per_token_per_rank(
                self.pool.bytes_per_token
            ),
            **self.sizes,
            "worker_pids": self.runner.worker_pids,
            "kv_capacity_tokens": self.pool.capacity_tokens,
            # sliding-window models: what a token costs in each kind of layer, and the tokens
            # the window layers' own pages hold (None: they share the page ids)
            "kv_bytes_per_token_by_kind": dict(self.pool.bytes_per_token_by_kind),
            "window_capacity_tokens": self.pool.window_capacity_tokens,
            "pool_used_tokens": used * ps,
            "pool_usage": used / self.pool.num_usable_pages,
            "cached_tokens": (self.tree.total_pages * ps) if self.tree else 0,
            "evictable_tokens": (self.tree.evictable_pages * ps) if self.tree else 0,
            "evicted_tokens": (self.tree.evicted_pages_total * ps) if self.tree else 0,
            "cache_hit_tokens": c["prefill_cached"],
            # hits by tier: the pool (the radix tree) and the storage tier (loaded back)
            "cache_hit_tokens_device": c["prefill_cached"] - c["prefill_cached_storage"],
            "cache_hit_tokens_storage": c["prefill_cached_storage"],
            "prefill_computed_tokens": c["prefill_computed"],
            "cache_hit_rate": c["prefill_cached"] / served if served else 0.0,
            "decode_tokens": c["decode_tokens"],
            "generated_tokens": c["generated_tokens"],
            "forward_steps": c["forward_steps"],
            "preemptions": c["preemptions"],
            "requests_finished": c["requests_finished"],
            "rank_restarts": c["rank_restarts"],  # a parallel engine's ranks, after one died
            "running": len(s.running),
            "waiting": len(s.waiting),
            "busy_s": s.busy_s,
            "forward_s": s.forward_s,
            # the share of step time outside the model (planning, batching, sampling, outputs)
            "scheduler_share": 1 - s.forward_s / s.busy_s if s.busy_s else 0.0,
            "overlap_schedule": s.overlap is not None,
            "forward_threads": run.threads,
            "steps_planned_ahead": s.overlap.steps_planned_ahead if s.overlap else 0,
            "throughput_tok_s": c["generated_tokens"] / s.busy_s if s.busy_s else 0.0,
            **self._expert_stats(),
            **self.disaggregation.counters(),
            "hierarchical_cache": self.hicache is not None,
            **(self.hicache.stats() if self.hicache is not None else {}),
            **self._spec_stats(c),
        }

    def _spec_stats(self, c: dict[str, int]) -> dict[str, Any]:
        """Speculative decoding: verify forwards, drafts proposed and accepted, the tokens a
        verify forward produced on average (accept length) and the share of drafts kept."""
        steps, drafts = c["spec_verify_steps"], c["spec_draft_tokens"]
        return {
            "speculative_algorithm": self.speculative.algorithm if self.speculative else None,
            "spec_verify_steps": steps,
            "spec_draft_tokens": drafts,
            "spec_accepted_tokens": c["spec_accepted_tokens"],
            "spec_accept_length": c["spec_verify_tokens"] / steps if steps else 0.0,
            "spec_accept_rate": c["spec_accepted_tokens"] / drafts if drafts else 0.0,
        }

    def _expert_stats(self) -> dict[str, Any]:
        """MoE models: routed (token, expert) pairs per MoE layer and expert, in the last
        forward step and since start."""
        load = self.runner.expert_load()
        if load is None:
            return {}
        return {"expert_load_last_step": load[0], "expert_load_total": load[1]}

    def flush_cache(self) -> bool:
        """Drop every cached page not in use by a running request; True if the tree is empty."""

        def flush() -> bool:
            if self.tree is None:
                return True
            self.tree.evict(self.tree.evictable_pages)
            return self.tree.total_pages == 0

        return self.scheduler.call(flush)

    def check_integrity(self) -> None:
        """Assert the page accounting (pool, tree, running requests) is consistent."""
        self.scheduler.call(self.scheduler.check_integrity)

    def shutdown(self) -> None:
        """Stop the scheduler and its threads (idempotent; also run at interpreter exit)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        _LIVE_ENGINES.discard(self)
        self.disaggregation.close()
        if self.hicache is not None:
            self._close_hicache()
        self.scheduler.shutdown()
        self.runner.shutdown()

    def _close_hicache(self) -> None:
        """Store what the tree still holds (the storage tier outlives the process), then wait
        for the writer."""
        tier, tree = self.hicache, self.tree
        try:
            self.scheduler.call(lambda: tier.backup_tree(tree))
        except Exception:  # a failing backup must not stop the shutdown
            logger.warning("storage tier: backing up the radix tree failed", exc_info=True)
        tier.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
