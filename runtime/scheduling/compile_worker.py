"""The compile worker: a process that compiles constraints for `compile_pool` and ships them back.

Started by `compile_pool` as its own interpreter (`LAUNCH`), it imports only `grammar`
and numpy, never torch or the engine. It talks over a socket (a `multiprocessing` connection on
file descriptor FD): first the vocabulary, then one job at a time, a `grammar.Constraint` as
its `wire()` tuple (strings and numbers), compiled with `grammar.compile`. Its address space
is capped at its size when ready plus the memory budget (`RLIMIT_AS`), so a compile that needs
more ends in a MemoryError here, not in the serving process.

A compiled constraint comes back as its automaton, the masks of the states the worker visited
(the start state's: the first mask is often the longest to build) and its forced text, pickled
with locks and the vocabulary left out (`dumps_portable` / `loads_portable`); the serving
process rebuilds it around its own vocabulary. A context-free one (a lark `CompiledCFG`: lark
grammars, recursive GBNF grammars and structural tags) comes back whole, its first mask built,
with the vocabulary, its shared lexing layout, locks and thread-local scratch left out
(`dumps_whole` / `loads_whole`); one that cannot be packed is compiled again by the caller.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import pickle
import resource
import sys
import threading
import time
from typing import Any

_LOCKS = (type(threading.Lock()), type(threading.RLock()))
_LOCAL = threading.local
# `python -c LAUNCH REPO FILE FD BUDGET`: this file run as a script with the repository first
# on the path (not `-m`, which would import the `runtime` package and with it torch)
LAUNCH = (
    "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
    "runpy.run_path(sys.argv[2], run_name='__main__')"
)

logger = logging.getLogger("runtime.compile_worker")


def compile_constraint(constraint: Any, vocab: Any) -> Any:
    """The compiled `grammar.Constraint` (`grammar.compile`); a schema that admits no
    instance is refused here (compiled, but no output could ever satisfy it)."""
    import grammar

    g = grammar.compile(constraint, vocab)
    if constraint.kind == "json_schema" and g.admits_nothing:
        raise grammar.EmptyLanguageError("the schema admits no instance")
    return g


class _Pickler(pickle.Pickler):
    """Leaves out what the serving process has its own of: the vocabulary, its lexing layout
    and its C trie walker (shared by every grammar over it), locks and thread-local scratch."""

    def __init__(self, file: io.BytesIO, vocab: Any) -> None:
        from grammar.cfg.compiler import VocabLayout
        from grammar.cfg.native_walk import CutWalker

        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.vocab = vocab
        self.layout_type = VocabLayout
        self.walker_type = CutWalker

    def persistent_id(self, obj: Any) -> str | None:
        if obj is self.vocab:
            return "vocab"
        if isinstance(obj, _LOCKS[1]):
            return "rlock"
        if isinstance(obj, _LOCKS[0]):
            return "lock"
        if isinstance(obj, _LOCAL):
            return "local"
        if isinstance(obj, self.layout_type):
            return "layout"
        if isinstance(obj, self.walker_type):
            return "walker"
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, vocab: Any) -> None:
        super().__init__(file)
        self.vocab = vocab

    def persistent_load(self, pid: str) -> Any:
        if pid == "vocab":
            return self.vocab
        if pid == "layout":
            from grammar.cfg.compiler import vocab_layout

            return vocab_layout(self.vocab)
        if pid == "walker":  # the serving process's own (None there: numpy walks)
            from grammar.cfg.native_walk import walker_for

            return walker_for(self.vocab)
        if pid == "local":
            return threading.local()
        return threading.RLock() if pid == "rlock" else threading.Lock()


def dumps_portable(compiled: Any, vocab: Any) -> bytes:
    """A compiled constraint's automaton, visited masks and forced text, as bytes."""
    from grammar.automata.fsm import START

    compiled.matcher().bitmask()  # the first mask: built here, not on the serving loop
    compiled.jump_forward(START)
    buf = io.BytesIO()
    _Pickler(buf, vocab).dump(compiled.portable())
    return buf.getvalue()


def loads_portable(data: bytes, vocab: Any) -> Any:
    from grammar.tokens.compiled import CompiledGrammar

    return CompiledGrammar.from_portable(_Unpickler(io.BytesIO(data), vocab).load(), vocab)


def dumps_whole(compiled: Any, vocab: Any) -> bytes:
    """A compiled constraint that is not an automaton (a lark `CompiledCFG`: lark grammars,
    recursive GBNF grammars and structural tags), its first mask built, as bytes."""
    compiled.matcher().bitmask()
    buf = io.BytesIO()
    _Pickler(buf, vocab).dump(compiled)
    return buf.getvalue()


def loads_whole(data: bytes, vocab: Any) -> Any:
    return _Unpickler(io.BytesIO(data), vocab).load()


def ship(compiled: Any, vocab: Any) -> tuple[str, bytes]:
    """(how it was packed, the bytes): "portable" (an automaton), "whole" (pickled with what
    the serving process has its own of left out), or "" when it could not be packed (then the
    serving process compiles it again)."""
    if hasattr(compiled, "portable"):
        return "portable", dumps_portable(compiled, vocab)
    try:
        return "whole", dumps_whole(compiled, vocab)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
        logger.warning("compile worker: %s not shipped: %r", type(compiled).__name__, exc)
        return "", b""


def error_record(exc: BaseException) -> tuple[str, str, dict]:
    """(class name, message, attributes) of a grammar error, to rebuild it in the caller."""
    attrs = {k: v for k, v in vars(exc).items() if isinstance(v, str | int | float | None)}
    return type(exc).__name__, str(exc), attrs


def _address_space_limit(budget_bytes: int) -> None:
    if budget_bytes <= 0:
        return
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    limit = size + budget_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def serve(conn: Any, budget_bytes: int) -> None:
    """The worker's loop: the vocabulary, then (job id, `Constraint.wire()`) jobs until EOF."""
    import grammar

    token_bytes, eos, specials, prebuild, names = pickle.loads(conn.recv_bytes())
    vocab = grammar.TokenVocabulary(token_bytes, eos, specials, names)
    if prebuild:
        try:
            grammar.prebuild(vocab)
        except Exception:  # the first compile builds what it needs
            logger.warning("compile worker: prebuild failed", exc_info=True)
    # what start-up built (modules, the vocabulary, the shared automata) lives as long as the
    # worker: kept out of the collector, a full collection during a job walks only the job's
    gc.collect()
    gc.freeze()
    _address_space_limit(budget_bytes)
    conn.send_bytes(pickle.dumps(("ready", vocab.hash)))
    while True:
        try:
            job_id, wire = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the serving process went away
            return
        start = time.perf_counter()
        payload = b""
        try:
            compiled = compile_constraint(grammar.Constraint.from_wire(wire), vocab)
            packing, payload = ship(compiled, vocab)
            del compiled
            header: tuple = ("ok", job_id, time.perf_counter() - start, packing)
        except MemoryError:
            header = ("memory", job_id)
        except grammar.GrammarError as exc:
            header = ("error", job_id, *error_record(exc))
        except RecursionError:
            header = ("error", job_id, "GrammarError", "the constraint nests too deeply", {})
        except Exception as exc:  # a constraint the compiler chokes on: still the user's
            header = ("error", job_id, "GrammarError", f"{type(exc).__name__}: {exc}", {})
        try:
            conn.send_bytes(pickle.dumps(header))
            conn.send_bytes(payload)
        except MemoryError:
            conn.send_bytes(pickle.dumps(("memory", job_id)))
            conn.send_bytes(b"")


def main(argv: list[str]) -> int:
    from multiprocessing.connection import Connection

    os.nice(5)  # beside the serving process on the same cores (its start too): it goes first
    logging.basicConfig(level=logging.WARNING)
    conn = Connection(int(argv[-2]))  # (after the repository path and this file: see LAUNCH)
    serve(conn, int(argv[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
