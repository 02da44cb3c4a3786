"""A real `python -m runtime.server` process on a free loopback port, for the server tests.

`shared_server()` starts one server on a tiny random Llama (SmolLM2's tokenizer and chat
template) the first time it is asked for and keeps it for the whole pytest process, so every
test module reuses it; `ServerProcess` starts others with their own flags.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.support.paths import REPO

STARTUP_TIMEOUT_S = 180
SMALL_ENGINE = ("--mem-budget-gb", "0.25", "--num-threads", "1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def constrained_decoding_available() -> bool:
    """Whether the engine has constrained decoding."""
    return importlib.util.find_spec("runtime.scheduling.constrained") is not None


_tiny_model: Path | None = None


def tiny_model_dir() -> Path:
    """A random 2-layer Llama with SmolLM2's tokenizer, built once per pytest process."""
    global _tiny_model
    if _tiny_model is None:
        from tests.support.tiny_models import make_tiny_model

        folder = Path(tempfile.mkdtemp(prefix="sgl-server-tiny-"))
        _tiny_model = make_tiny_model(folder)
    return _tiny_model


class ServerProcess:
    """`python -m runtime.server ...` as a child process; `.url` once `/health` answers."""

    def __init__(self, model: Path | None, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="sgl-server-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "runtime.server", "--port", str(self.port), *args]
        if model is not None:
            cmd += ["--model", str(model)]
        env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, env=env
        )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S}s:\n{self.logs()}")

    def logs(self, tail: int | None = 5000) -> str:
        text = Path(self.log.name).read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Send `sig` and wait for the exit status (killing the process if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


_shared: ServerProcess | None = None


def shared_server() -> ServerProcess:
    """The tiny-model server every test module shares (started on first use)."""
    global _shared
    if _shared is None or _shared.proc.poll() is not None:
        _shared = ServerProcess(tiny_model_dir(), *SMALL_ENGINE)
        atexit.register(_shared.stop)
    return _shared


_shared_default: ServerProcess | None = None


def shared_default_server() -> ServerProcess:
    """The default-model server (SmolLM2-135M, 0.5 GB for the KV cache) the heavy test modules
    share, started on first use; its tests only send requests (clean exit on SIGTERM:
    tests/server/test_lifecycle.py)."""
    global _shared_default
    if _shared_default is None or _shared_default.proc.poll() is not None:
        _shared_default = ServerProcess(None, "--mem-budget-gb", "0.5")
        atexit.register(_shared_default.stop)
    return _shared_default


def engine_stats(url: str, headers: dict[str, str] | None = None) -> dict:
    return httpx.get(f"{url}/stats", headers=headers, timeout=30).json()


def wait_until_idle(url: str, timeout: float = 20.0) -> dict:
    """Poll /stats until nothing runs or waits and no page is owned outside the cache."""
    deadline = time.monotonic() + timeout
    while True:
        stats = engine_stats(url)
        idle = stats["running"] == 0 and stats["waiting"] == 0
        if idle and stats["pool_used_tokens"] <= stats["cached_tokens"]:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"server not idle after {timeout}s: {stats}")
        time.sleep(0.1)
