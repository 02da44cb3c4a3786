"""A program that never shuts its engine down still exits cleanly: the engine is shut down at
interpreter exit, before Python finalizes (a daemon scheduler thread inside a native op when
Python finalizes is unwound through C++ frames, and the process aborts after the program has
finished: "terminate called without an active exception")."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.paths import REPO
from tests.support.tiny_models import make_tiny_model

PROGRAM = textwrap.dedent(
    """
    import atexit, sys
    seen = {}
    # registered before the engine module's own exit hook, so it runs after it (LIFO)
    atexit.register(lambda: print("closed at exit:", seen["engine"]._closed, flush=True))
    from runtime import Engine
    engine = Engine(sys.argv[1], dtype="fp32")
    seen["engine"] = engine
    out = engine.generate(["Hello", "Bonjour"], max_new_tokens=8, temperature=0.0,
                          ignore_eos=True)
    print("tokens:", [len(r.token_ids) for r in out], flush=True)
    print("closed before exit:", engine._closed, flush=True)
    """
)


def test_an_engine_left_open_is_shut_down_at_exit(tmp_path: Path) -> None:
    folder = make_tiny_model(tmp_path / "tiny", seed=3)
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tokens: [8, 8]" in proc.stdout
    assert "closed before exit: False" in proc.stdout
    assert "closed at exit: True" in proc.stdout, proc.stdout
    assert "terminate called" not in proc.stderr


def test_shutdown_twice_is_harmless(tmp_path: Path) -> None:
    from runtime import Engine

    with Engine(str(make_tiny_model(tmp_path / "tiny", seed=4)), dtype="fp32") as engine:
        engine.generate("Hi", max_new_tokens=2, temperature=0.0)
        engine.shutdown()
    engine.shutdown()
    assert engine._closed
