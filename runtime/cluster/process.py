"""A child process in its own process group, and free loopback ports for children to bind.

Every child runs in a new session (so its own process group): a Ctrl-C in the terminal reaches
only the cluster process, which then stops each group in order, and `killpg` also reaches any
grandchild a child started. On Linux a child also gets SIGTERM when the thread that started it
dies (`PR_SET_PDEATHSIG`), so a cluster process killed with SIGKILL leaves no orphans; the
threads that start children must therefore live as long as the cluster does.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it; a later bind may still race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    # runs in the child between fork and exec: ask the kernel for SIGTERM when the parent dies
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ChildProcess:
    """One command run in its own process group, its output appended to a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self._terminated = False  # SIGTERM sent: a second one could cut a graceful exit short

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._terminated = False
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        logger.info("%s started (pid %d): %s", self.name, self.popen.pid, " ".join(self.argv))

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def exit_code(self) -> int | None:
        """None while running (or never started); the exit status once it has ended."""
        return None if self.popen is None else self.popen.poll()

    def is_running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the child's whole process group (nothing if it is gone)."""
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        """Ask the group to exit (SIGTERM), once."""
        if not self._terminated:
            self._terminated = True
            self.signal_group(signal.SIGTERM)

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the group, wait up to `grace_s`, then SIGKILL it; returns the exit status."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.terminate()
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in %.0f s: killing it", self.name, grace_s)
        # the leader may be gone while a grandchild still holds the group: kill what is left
        self.signal_group(signal.SIGKILL)
        code = self.popen.wait()
        logger.info("%s stopped (exit status %s)", self.name, code)
        return code

    def log_tail(self, max_chars: int = 2000) -> str:
        """The end of the child's log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-max_chars:]
