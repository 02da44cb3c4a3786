"""Constrained decoding in the engine: grammar masks, compilation off the loop, jump-forward.

A request with `regex`, `json_schema`, `choices`, `dtype`, `grammar` (lark text), `ebnf`
(GBNF text) or `structural_tag` (the keywords of `grammar.constraint.KINDS`, read once into a
`grammar.Constraint`) gets a `ConstraintState`. Its grammar compiles in a worker
process with a time and a memory budget (`compile_pool`; the request waits in the queue
meanwhile; other requests go on). Each step the packed masks of the constrained rows are
applied to their logits in one call; rows without a constraint are not touched. After each
sampled token the matcher advances; when the compressed DFA says the next bytes are forced,
jump-forward appends them:

    1. text  = bytes of all output tokens + forced bytes (cut to whole UTF-8 characters)
    2. ids   = tokenizer.encode(text)                   (what the tokenizer would produce)
    3. keep  = common prefix of the old output ids and `ids`
    4. the KV of output tokens after `keep` is dropped (their pages freed), `ids[keep:]` become
       the request's tail and are prefilled in one extend step, whose last logits sample the
       next token. The tokens therefore always equal the tokenizer's encoding of the text.

Jumped tokens were not sampled: their log-probs are reported as 0.0 (forced).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from grammar.constraint import Constraint
from grammar.tokens.matcher import Matcher
from runtime import settings
from runtime.kernels import reference
from runtime.memory.pages import PageBook
from runtime.scheduling.compile_pool import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, CompilePool
from runtime.scheduling.detokenize import marker_ids
from runtime.scheduling.request import Request

if TYPE_CHECKING:
    from grammar import TokenVocabulary

logger = logging.getLogger(__name__)

INCOMPLETE = "max_new_tokens reached before the constraint was complete"
# (logits [B, V], packed bitmask [R, W], rows [R] | None) -> logits, masked in place
BitmaskFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


# what decoding asks of a compiled constraint's matcher: the one `grammar.Matcher` protocol
TokenMatcher = Matcher


class Healing(Protocol):
    """Token healing of the prompt's end (healing.Healing): wraps the request's matcher."""

    def matcher(self, inner: TokenMatcher | None) -> TokenMatcher: ...


class ConstraintState:
    """A request's constraint: its compile job, then its matcher. With `healing` the matcher
    first spells the healed prefix (runtime/scheduling/healing.py); a compile result of None
    (a request that only heals) has no grammar of its own."""

    def __init__(self, future: Future, jump_forward: bool, healing: Healing | None = None) -> None:
        self.future = future
        self.jump_forward = jump_forward
        self.healing = healing
        self.matcher: TokenMatcher | None = None
        self.vocab: TokenVocabulary | None = None
        self.compile_time_s = 0.0
        self.jumps = 0
        self.jumped_tokens = 0

    def refused(self) -> bool:
        """Whether its compile has ended with an error."""
        return self.matcher is None and self.future.done() and self.future.exception() is not None

    def ready(self) -> bool:
        if self.matcher is not None:
            return True
        if not self.future.done():
            return False
        grammar, vocab, seconds = self.future.result()  # raises the compile error, if any
        matcher = grammar.matcher() if grammar is not None else None
        if self.healing is not None:
            matcher = self.healing.matcher(matcher)
        self.matcher, self.vocab, self.compile_time_s = matcher, vocab, seconds
        return True


class Tokenizer(Protocol):
    """What constrained decoding asks of the engine's tokenizer (a `transformers` one): its
    pieces, read once into the token vocabulary, and `encode` to re-tokenise jumped text."""

    def __len__(self) -> int: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def constraint_vocabulary(tokenizer: Tokenizer) -> TokenVocabulary:
    """The tokenizer's vocabulary for constraints: special tokens are never allowed, except the
    call and reasoning markers (`detokenize.MARKER_TOKENS`), which stand for their text (as
    XGrammar reads added tokens): a grammar can then match a call's opening on the token the
    model was trained to write, and the text of a constrained request spells it."""
    from grammar import TokenVocabulary

    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    markers = {i: t for i, t in marker_ids(tokenizer).items() if i not in vocab.eos_token_ids}
    if not markers:
        return vocab
    data = [vocab.token_bytes(i) for i in range(len(vocab))]
    for i, text in markers.items():
        if i < len(data):
            data[i] = text.encode("utf-8")
    specials = vocab.special_token_ids - set(markers)
    return TokenVocabulary(data, vocab.eos_token_ids, specials, vocab.token_names)


class ConstraintHooks:
    """The scheduler calls these; they run on the scheduler thread (compiles excepted)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        eos_token_ids: Iterable[int],
        *,
        json_schema_mode: str = "strict",
        compile_timeout_s: float | None = None,
        compile_memory_mb: int | None = None,
        apply_token_bitmask_: BitmaskFn | None = None,
        compiles: CompilePool | None = None,
    ) -> None:
        """`json_schema_mode`: the default of requests with a `json_schema` ("strict" or
        "exact"); `compile_timeout_s` / `compile_memory_mb`: each compile's budgets (None: the
        compile pool's defaults); `apply_token_bitmask_`: the attention backend's mask kernel
        (the torch reference when not given); `compiles`: the compile pool to use (None: one of
        its own, over this tokenizer's vocabulary, with those budgets). The server reads the
        pool from here (`Engine.compile_pool`), never from a module global."""
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_token_ids)
        self.apply_token_bitmask_ = apply_token_bitmask_ or reference.apply_token_bitmask_
        self._vocab: TokenVocabulary | None = None
        self._vocab_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sgl-grammar")
        self.json_schema_mode = json_schema_mode
        self.compiles = compiles or CompilePool(
            self.vocab,
            timeout_s=compile_timeout_s or DEFAULT_TIMEOUT_S,
            memory_mb=compile_memory_mb or DEFAULT_MEMORY_MB,
        )
        self._prebuilt: Future | None = None
        if settings.GRAMMAR_PREBUILD.get():
            # first on the grammar thread, so no request's compile waits for these
            self._prebuilt = self._pool.submit(self._prebuild)

    def wait_ready(self, timeout_s: float) -> bool:
        """Start the compile workers and wait (up to `timeout_s`) until the prebuild is done
        and every worker is ready: a server says it is up only then, so its first constrained
        requests do not wait for them (on a loaded machine that took longer than a compile's
        budget). False when that did not happen in time (never an error: requests then wait)."""
        deadline = time.monotonic() + timeout_s
        self.compiles.start()
        if self._prebuilt is not None:
            try:
                self._prebuilt.result(timeout=timeout_s)
            except TimeoutError:
                return False
        return self.compiles.wait_ready(max(0.0, deadline - time.monotonic()))

    def _prebuild(self) -> None:
        """The vocabulary and the pieces every schema shares (`grammar.prebuild`: format
        automata, token tables). A failure here is logged; the first compile then builds
        what it needs (and reports its own error)."""
        try:
            import grammar

            grammar.prebuild(self.vocab())
        except Exception:  # never fatal: nothing has asked for a constraint yet
            logger.warning("grammar prebuild failed", exc_info=True)

    def vocab(self) -> TokenVocabulary:
        with self._vocab_lock:
            if self._vocab is None:
                self._vocab = constraint_vocabulary(self.tokenizer)
            return self._vocab

    # ---- from the caller's thread ----------------------------------------------------------
    def constraint_of(self, fields: dict[str, Any]) -> Constraint | None:
        """The `grammar.Constraint` named by request keywords (`regex`, `json_schema`, ...,
        `json_schema_mode`, `whitespace_pattern`; others ignored), under this engine's default
        mode; None when none is given. ConstraintError (a ValueError) naming the field."""
        return Constraint.from_kwargs(fields, default_mode=self.json_schema_mode)

    def attach(
        self,
        req: Request,
        constraint: Constraint | None = None,
        *,
        jump_forward: bool = True,
        wake: Any = None,
        **fields: Any,
    ) -> None:
        """Start compiling `constraint` for `req` (or the one its keyword `fields` name, as
        `constraint_of` reads them); `wake` is called when the compile ends."""
        if constraint is None:
            constraint = self.constraint_of(fields)
            if constraint is None:
                return
        future = self.compiles.submit(constraint, req)
        if wake is not None:
            future.add_done_callback(lambda _: wake())
        req.constraint = ConstraintState(future, jump_forward)
        if jump_forward:
            req.cache_limit = len(req.prompt_ids)  # outputs may be re-tokenised: cache at end

    # ---- on the scheduler thread -------------------------------------------------------------
    def admissible(self, req: Request) -> bool | BaseException:
        """True when the request may run, False while compiling, the error if it failed."""
        st = req.constraint
        if st is None:
            return True
        try:
            return st.ready()
        except BaseException as exc:  # the compile error goes to the request
            return exc

    def mask_logits(self, reqs: list[Request], logits: torch.Tensor) -> list[Request]:
        """Mask the constrained rows of `logits` (row i is reqs[i]); returns requests whose
        constraint allows no token at all (to be aborted)."""
        rows = [i for i, r in enumerate(reqs) if r.constraint is not None]
        if not rows:
            return []
        masks = np.stack([self._bitmask(reqs[i]) for i in rows])
        dead = [reqs[i] for i, m in zip(rows, masks, strict=True) if not m.any()]
        self.apply_token_bitmask_(
            logits, torch.from_numpy(masks), torch.tensor(rows, dtype=torch.long)
        )
        return dead

    @staticmethod
    def _bitmask(req: Request) -> np.ndarray:
        """The request's mask; all zeros (so it is aborted alone) if building it fails, e.g. a
        lazily built automaton reaching its state budget: the error goes to that request."""
        import grammar

        st = req.constraint
        try:
            return st.matcher.bitmask()
        except grammar.GrammarError as exc:
            req.error = exc
            return np.zeros((len(st.vocab) + 31) // 32, dtype=np.int32)

    def after_token(self, book: PageBook, req: Request) -> None:
        """Advance the matcher by the sampled token; finish or jump forward as it says. A
        GrammarError on the way (a state budget reached) aborts this request only."""
        import grammar

        try:
            self._after_token(book, req)
        except grammar.GrammarError as exc:
            req.error = exc
            req.finish_reason = "abort"

    def _after_token(self, book: PageBook, req: Request) -> None:
        st = req.constraint
        if st is None:
            return
        tok = req.output_ids[-1]
        st.matcher.advance(tok)
        if getattr(st.matcher, "unconstrained", False):
            req.constraint = None  # healed, and nothing else constrains it: decode freely
            return
        if tok in self.eos_ids:
            return  # the output processor finishes it ("stop")
        if st.matcher.is_dead():  # complete, and nothing may follow
            req.finish_reason = "stop"
            return
        if st.jump_forward and len(req.output_ids) < req.params.max_new_tokens:
            self._jump(book, req, st)
            if req.finish_reason is None and st.matcher.is_dead():
                req.finish_reason = "stop"

    def _jump(self, book: PageBook, req: Request, st: ConstraintState) -> None:
        from grammar.tokens.matcher import complete_utf8_prefix

        forced = st.matcher.forced_bytes()
        if not forced:
            return
        # re-tokenised from after the last token that has no text (a special token a grammar
        # named by id): its text could not spell it again
        out = req.output_ids
        base = next((len(out) - k for k, t in enumerate(reversed(out))
                     if st.vocab.token_bytes(t) is None), 0)  # fmt: skip
        old = b"".join(st.vocab.token_bytes(t) or b"" for t in out[base:])
        text = complete_utf8_prefix(old + forced)
        data = text.encode("utf-8")
        if len(data) <= len(old):
            return
        new_ids = out[:base] + self.tokenizer.encode(text, add_special_tokens=False)
        if b"".join(st.vocab.token_bytes(t) or b"" for t in new_ids[base:]) != data:
            return  # the tokenizer does not round-trip this text: decode normally instead
        # the unchanged head of the output keeps its KV; the rest is recomputed
        same = 0
        for a, b in zip(out, new_ids, strict=False):
            if a != b:
                break
            same += 1
        keep = len(req.prompt_ids) + same
        if keep < req.cached:
            return  # would rewrite shared (tree) pages: decode normally instead
        st.matcher.advance_bytes(data[len(old) :])
        st.jumps += 1
        st.jumped_tokens += len(new_ids) - len(out)
        out[same:] = new_ids[same:]
        if len(out) >= req.params.max_new_tokens:
            # the forced text does not fit: keep what does and stop here
            del out[req.params.max_new_tokens :]
            req.finish_reason = "length"
            if len(new_ids) > len(out) or not st.matcher.is_accepting():
                req.error = RuntimeError(INCOMPLETE)
        if req.logprobs is not None:
            req.logprobs[same:] = [0.0] * (len(out) - same)
        if req.top_logprobs is not None:
            req.top_logprobs[same:] = [{t: 0.0} for t in out[same:]]
        req.streamed_token_len = min(req.streamed_token_len, same)
        book.truncate(req, keep)
        req.prefill_done = req.computed == req.seq_len - 1

    def length_reason(self, req: Request) -> str | None:
        """Why a constrained request that hit max_new_tokens is incomplete (or None)."""
        st = req.constraint
        if st is None or st.matcher is None or st.matcher.is_accepting():
            return None
        return INCOMPLETE

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.compiles.shutdown()
