"""Soak test of `runtime.server` with faults (see `main`); also the server launcher the other
server benchmarks here share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
SMALL_ENGINE = ["--mem-budget-gb", "0.5", "--num-threads", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(slots=True)
class Server:
    proc: subprocess.Popen
    url: str
    log: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, n: int = 4000) -> str:
        return Path(self.log).read_text(errors="replace")[-n:]


def start_server(
    model: str | None, extra: list[str] | None = None, module: str = "runtime.server"
) -> Server:
    """`python -m runtime.server` on a free port (the default model unless `model`), once
    `/health` answers."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="sgl-soak-", suffix=".log", delete=False).name
    cmd = [sys.executable, "-m", module, "--port", str(port), *SMALL_ENGINE, *(extra or [])]
    if model:
        cmd += ["--model", model]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server.tail()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"server did not start:\n{server.tail()}")
