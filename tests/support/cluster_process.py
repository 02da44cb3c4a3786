"""A real `python -m runtime.cluster` process (replicas + the gateway) for the cluster tests.

`ClusterProcess` starts the CLI exactly as a user would, reads its one stdout line
`router: URL`, and can list the replicas (through the gateway's GET /workers), find their
process ids (children of the cluster process, by their `--port`), read their /metrics, and
stop the whole thing with a signal.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.support.paths import REPO

STARTUP_TIMEOUT_S = 240
SMALL_REPLICA = "--mem-budget-gb 0.25 --num-threads 1"
ROUTER_LINE = re.compile(r"^router: (http://\S+)$")


def launch(
    model: Path | str,
    policy: str,
    log_dir: Path,
    replicas: int = 2,
    extra: tuple[str, ...] = (),
    **kw,
) -> subprocess.Popen:
    """`python -m runtime.cluster ...` with small replicas (`extra`: more flags, e.g.
    `--prefill 1 --decode 1`); stdout piped (stderr: `kw`)."""
    cmd = [
        sys.executable, "-m", "runtime.cluster",
        "--replicas", str(replicas),
        "--model", str(model),
        "--policy", policy,
        "--port", "0",
        "--log-dir", str(log_dir),
        "--health-check-interval", "1",
        "--server-args", SMALL_REPLICA,
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True, **kw)


class ClusterProcess:
    def __init__(
        self, model: Path, policy: str, replicas: int = 2, extra: tuple[str, ...] = ()
    ) -> None:
        self.log_dir = Path(tempfile.mkdtemp(prefix="sgl-cluster-test-"))
        self.stderr = open(self.log_dir / "cluster.log", "wb")  # noqa: SIM115
        self.proc = launch(model, policy, self.log_dir, replicas, extra, stderr=self.stderr)
        self.stdout_lines: list[str] = []
        self.url = self._read_router_line()

    def _read_router_line(self) -> str:
        # read stdout on a thread so a silent child cannot block the test past the timeout
        got = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.stdout_lines.append(line.rstrip("\n"))
                got.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            if got.wait(0.5):
                match = ROUTER_LINE.match(self.stdout_lines[0])
                assert match, f"unexpected first stdout line {self.stdout_lines[0]!r}"
                return match.group(1)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"cluster did not print its router line; log:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.log_dir.glob("*.log"))
        )

    def workers(self) -> list[dict]:
        return httpx.get(f"{self.url}/workers", timeout=10).json()["workers"]

    def replica_urls(self) -> list[str]:
        return sorted(w["url"] for w in self.workers())

    def replica_pids(self) -> dict[str, int]:
        return replica_pids(self.proc.pid)

    def descendants(self) -> list[int]:
        return descendants(self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr.close()
        if self.proc.returncode == 0:  # keep the logs of a failed run for its error message
            shutil.rmtree(self.log_dir, ignore_errors=True)
        return self.proc.returncode


def replica_pids(cluster_pid: int) -> dict[str, int]:
    """Replica URL -> pid of its server process (a child of the cluster process)."""
    pids = {}
    for pid in children(cluster_pid):
        argv = cmdline(pid)
        if "runtime.server" in argv and "--port" in argv:
            port = argv[argv.index("--port") + 1]
            pids[f"http://127.0.0.1:{port}"] = pid
    return pids


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        kids = [k for p in frontier for k in children(p)]
        found += kids
        frontier = kids
    return found


def children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (any session or process group)."""
    kids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name in parentheses may hold spaces: split after its closing paren
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            kids.append(int(entry.name))
    return kids


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def metric_sum(url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus metric's samples on `url`/metrics whose labels include `labels`."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, label_text = head.partition("{")
        if metric != name:
            continue
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
        if all(pairs.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


def completions_answered(url: str) -> float:
    """Requests a replica answered with 200 on /v1/completions."""
    return metric_sum(url, "sgl_requests_total", endpoint="/v1/completions", status="200")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
