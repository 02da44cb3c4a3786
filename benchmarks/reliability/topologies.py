"""The topologies `benchmarks.reliability.soak` runs against, and the fault each one gets (SIGKILL):

- `server`: one `runtime.server`; one of its compile workers is killed (the compile pool
  replaces it);
- `replicas`: `runtime.cluster --replicas 2`; one replica's server process is killed (the
  cluster's supervisor restarts it and puts it back behind the gateway);
- `pd`: `runtime.cluster --prefill 2 --decode 1`; a prefill server is killed while it has a
  request in flight (prefilling it or sending its KV to the decode server);
- `tp`: one `runtime.server --tp 2`; one tensor-parallel rank is killed (the engine restarts
  its ranks).

Each topology lists its serving processes (URL and pid: `servers()`), so the soak can read
every one's memory, flush its cache and check its pool after the run, and says whether the
killed process is back (`recovered()`).
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = ("server", "replicas", "pd", "tp")
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


def children(pid: int, marker: bytes) -> list[int]:
    """The processes whose parent is `pid` and whose command line contains `marker`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == pid and marker in cmd:
            out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(slots=True)
class Fault:
    at: float  # time.monotonic() of the kill
    what: str
    back_after_s: float | None = None  # seconds until the topology had recovered


@dataclass(slots=True)
class Topology:
    """A started topology: `url` takes the load, `proc` is its top process."""

    name: str
    url: str
    proc: subprocess.Popen
    log: str
    faults: list[Fault] = field(default_factory=list)
    expected: int = 1  # serving processes when whole

    # ---- the serving processes ------------------------------------------------------------
    def servers(self) -> list[tuple[str, int]]:
        """(URL, pid) of every serving process now."""
        if self.name in ("server", "tp"):
            return [(self.url, self.proc.pid)]
        out = []
        for pid in children(self.proc.pid, b"runtime.server"):
            argv = _cmdline(pid)
            if "--port" in argv:
                port = argv[argv.index("--port") + 1]
                out.append((f"http://127.0.0.1:{port}", pid))
        return sorted(out)

    def role(self, pid: int) -> str:
        argv = _cmdline(pid)
        if "--disaggregation-mode" in argv:
            return argv[argv.index("--disaggregation-mode") + 1]
        return "replica" if self.name == "replicas" else "server"

    def ranks(self) -> list[int]:
        """A `--tp` server's rank processes."""
        return children(self.proc.pid, b"runtime.workers.worker")

    def recovered(self) -> bool:
        """Every serving process (and every rank) is up and answers /health; in a cluster,
        the gateway lists each one as healthy."""
        servers = self.servers()
        if len(servers) != self.expected or not all(_healthy(u) for u, _ in servers):
            return False
        if self.name == "tp":  # the ranks the engine reports (once joined) are the live ones
            try:
                reported = httpx.get(f"{self.url}/stats", timeout=30).json()["worker_pids"]
            except (httpx.HTTPError, ValueError, KeyError):
                return False
            return len(reported) == 2 and set(reported) == set(self.ranks())
        if self.name in ("replicas", "pd"):
            try:
                workers = httpx.get(f"{self.url}/workers", timeout=5).json().get("workers", [])
            except (httpx.HTTPError, ValueError):
                return False
            healthy = {w["url"] for w in workers if w.get("is_healthy")}
            return {u for u, _ in servers} <= healthy
        return True

    # ---- faults ----------------------------------------------------------------------------
    def inject(self, rng: random.Random) -> Fault | None:
        """Kill this topology's victim (None: none could be found right now)."""
        if self.name == "server":
            pids = children(self.proc.pid, b"compile_worker.py")
            what = "compile worker"
        elif self.name == "tp":
            pids = self.ranks()
            what = "tensor-parallel rank"
        elif self.name == "replicas":
            pids = [pid for _, pid in self.servers()]
            what = "replica"
        else:
            pids = self._busy_prefill()
            what = "prefill server with a request in flight"
        if not pids:
            return None
        victim = rng.choice(pids)
        os.kill(victim, signal.SIGKILL)
        fault = Fault(time.monotonic(), f"{what} (pid {victim})")
        self.faults.append(fault)
        return fault

    def _busy_prefill(self, wait_s: float = 20.0) -> list[int]:
        """A prefill server with a request in flight (its prefill or its KV transfer), polled
        for up to `wait_s`; any prefill server if none was seen busy."""
        prefill = [(u, p) for u, p in self.servers() if self.role(p) == "prefill"]
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for url, pid in prefill:
                try:
                    stats = httpx.get(f"{url}/stats", timeout=2).json()
                except (httpx.HTTPError, ValueError):
                    continue
                if stats.get("server_in_flight", 0) > 0:
                    return [pid]
            time.sleep(0.02)
        return [p for _, p in prefill]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, n: int = 4000) -> str:
        return Path(self.log).read_text(errors="replace")[-n:]


def start(name: str, model: str | None, extra: list[str] | None = None) -> Topology:
    """Start topology `name` (the default model unless `model`; `extra` server flags for
    every server), once it serves."""
    if name not in TOPOLOGIES:
        raise ValueError(f"unknown topology {name!r}; expected one of {TOPOLOGIES}")
    if name in ("server", "tp"):
        s = start_server(model, [*(extra or []), *(["--tp", "2"] if name == "tp" else [])])
        return Topology(name, s.url, s.proc, s.log)
    log = tempfile.NamedTemporaryFile(prefix=f"sgl-soak-{name}-", suffix=".log", delete=False)
    shape = ["--replicas", "2"] if name == "replicas" else ["--prefill", "2", "--decode", "1"]
    flags = " ".join([*SMALL_ENGINE, *(extra or [])])
    cmd = [sys.executable, "-m", "runtime.cluster", *shape, "--port", "0",
           "--server-args", flags, "--health-check-interval", "2",
           "--log-dir", tempfile.mkdtemp(prefix=f"sgl-soak-{name}-logs-")]  # fmt: skip
    if model:
        cmd += ["--model", model]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log, env=env)
    line = proc.stdout.readline().decode() if proc.stdout else ""
    found = re.match(r"router: (\S+)", line)
    if not found:
        proc.kill()
        raise RuntimeError(f"the cluster did not start:\n{Path(log.name).read_text()[-4000:]}")
    return Topology(name, found.group(1), proc, log.name, expected=2 if name == "replicas" else 3)
