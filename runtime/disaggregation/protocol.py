"""The KV hand-off protocol between a prefill server and a decode server, on TCP.

The decode server connects to the prefill server's bootstrap port and pulls one room:

    decode  -> prefill   REGISTER {room, layout}          what it asks for, and its pool layout
    prefill -> decode    ERROR {message}                  layout mismatch, unknown room, timeout
                     or  META {prompt_ids, output_ids, logprobs, top_logprobs,
                               kv_tokens, num_pages}      once the room's prefill is done
    prefill -> decode    PAGE {index} + page bytes         num_pages times, in order
    prefill -> decode    DONE {}
    decode  -> prefill   ACK {}                           the prefill side may now forget it

With the `mooncake` backend (mooncake.py) META also carries `mooncake: {session, bases,
pages}` (where the pages lie in the prefill pool), no PAGE frames follow: the decode server
reads the pages itself, then sends ACK {pages} and waits for DONE (the prefill side held
them until the ACK) or ERROR.

Every frame is `MAGIC kind:u8 header_len:u32 payload_len:u64`, a JSON header, then the payload
(only PAGE frames carry one). A page is every layer's KV of `page_size` tokens in the pool's
dtype (`runtime.memory.kv_pages`); the layout sent at registration must equal the prefill
side's (model fingerprint, dtype, page size, per-layer tensors) or no page moves.

On GPUs a production engine moves pages device to device instead (RDMA through NIXL or
Mooncake): REGISTER and META stay as they are, the PAGE frames become one RDMA read of the
registered pool region per page range, and DONE / ACK become the transfer engine's completion.
"""

from __future__ import annotations

import enum
import json
import socket
import struct
from dataclasses import dataclass
from typing import Any

from runtime.errors import KVTransferError

MAGIC = b"SGKV"
_HEAD = struct.Struct("!4sBIQ")
MAX_HEADER_BYTES = 64 * 1024 * 1024  # prompt ids of a very long prompt fit easily
VERSION = 1


class Kind(enum.IntEnum):
    REGISTER = 1
    META = 2
    PAGE = 3
    DONE = 4
    ERROR = 5
    ACK = 6


@dataclass(slots=True, frozen=True)
class KVLayout:
    """What a pool's pages are made of; two servers can exchange pages only if these match."""

    model: str  # fingerprint of the model's config and weights (Engine.model_fingerprint)
    dtype: str
    page_size: int
    num_layers: int
    tensors: tuple[tuple[str, int, int], ...]  # per layer: (name, heads, dim)
    page_bytes: int
    kv_calibration: str = ""  # fp8 pools: the digest of their scales and offsets

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "model": self.model,
            "dtype": self.dtype,
            "page_size": self.page_size,
            "num_layers": self.num_layers,
            "tensors": [list(t) for t in self.tensors],
            "page_bytes": self.page_bytes,
            "kv_calibration": self.kv_calibration,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> KVLayout:
        if raw.get("version") != VERSION:
            raise KVTransferError(f"protocol version {raw.get('version')} != {VERSION}")
        return cls(
            model=str(raw["model"]),
            dtype=str(raw["dtype"]),
            page_size=int(raw["page_size"]),
            num_layers=int(raw["num_layers"]),
            tensors=tuple((str(n), int(h), int(d)) for n, h, d in raw["tensors"]),
            page_bytes=int(raw["page_bytes"]),
            kv_calibration=str(raw.get("kv_calibration", "")),
        )

    def mismatch(self, other: KVLayout) -> str | None:
        """Why pages of `other` cannot go into a pool of this layout (None: they can)."""
        names = ("model", "dtype", "page_size", "num_layers", "tensors", "page_bytes",
                 "kv_calibration")  # fmt: skip
        for name in names:
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                return f"KV layout mismatch: {name} is {theirs!r} there, {mine!r} here"
        return None


def send(
    sock: socket.socket, kind: Kind, header: dict[str, Any], payload: bytes | memoryview = b""
) -> None:
    data = json.dumps(header).encode()
    size = payload.nbytes if isinstance(payload, memoryview) else len(payload)
    sock.sendall(_HEAD.pack(MAGIC, int(kind), len(data), size) + data)
    if size:
        sock.sendall(payload)  # a memoryview goes out without a copy


SOCKET_BUFFER_BYTES = 8 * 1024 * 1024


def tune(sock: socket.socket) -> None:
    """Large kernel buffers, so a page moves in few system calls."""
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        except OSError:
            pass  # the kernel's limit applies


def _read_exact(sock: socket.socket, count: int, into: memoryview | None = None) -> bytes:
    buf = into if into is not None else memoryview(bytearray(count))
    got = 0
    while got < count:
        # few large reads, so the receiving thread rarely queues for the GIL behind the
        # engine's scheduler thread (a socket with a timeout may still return early: loop)
        n = sock.recv_into(buf[got:], count - got, socket.MSG_WAITALL)
        if n == 0:
            raise KVTransferError(f"connection closed by the peer ({got} of {count} bytes read)")
        got += n
    return b"" if into is not None else bytes(buf)


def receive(
    sock: socket.socket, payload_into: memoryview | None = None
) -> tuple[Kind, dict[str, Any], bytes]:
    """One frame. With `payload_into`, a payload is read straight into that buffer (which
    must be exactly its size) and the returned payload is empty."""
    magic, kind, header_len, payload_len = _HEAD.unpack(_read_exact(sock, _HEAD.size))
    if magic != MAGIC:
        raise KVTransferError(f"not a KV transfer peer (frame starts with {magic!r})")
    if header_len > MAX_HEADER_BYTES:
        raise KVTransferError(f"frame header of {header_len} bytes is over the limit")
    try:
        kind = Kind(kind)
    except ValueError:
        raise KVTransferError(f"unknown frame kind {kind}") from None
    header = json.loads(_read_exact(sock, header_len)) if header_len else {}
    if payload_into is not None and payload_len:
        if payload_len != len(payload_into):
            raise KVTransferError(
                f"{kind.name} payload of {payload_len} bytes, expected {len(payload_into)}"
            )
        _read_exact(sock, payload_len, payload_into)
        return kind, header, b""
    return kind, header, _read_exact(sock, payload_len) if payload_len else b""


def expect(sock: socket.socket, kind: Kind, what: str) -> dict[str, Any]:
    """The next frame's header, which must be `kind` (an ERROR frame raises its message)."""
    got, header, _ = receive(sock)
    if got is Kind.ERROR:
        raise KVTransferError(f"{what}: {header.get('message', 'unknown error')}")
    if got is not kind:
        raise KVTransferError(f"{what}: expected {kind.name}, got {got.name}")
    return header
