"""The `mooncake` backend of the storage tier: page objects in Mooncake Store.

Mooncake Store is a distributed object store: a master (`mooncake_master`) keeps the objects'
metadata and where they live, and clients lend memory segments to hold them (this engine lends
`global_segment_size`; a store service, `python -m mooncake.mooncake_store_service`, lends
memory that outlives the engine). Objects move between clients over Mooncake's transfer engine
(`tcp` here, `rdma` where the cluster has it).

Settings are SGLang's: the keys of `--hicache-storage-backend-extra-config` (JSON) and, where a
key is absent, the `MOONCAKE_*` environment variables (`runtime.settings`). Keys are the tier's
page keys under `sgl-hicache/<fingerprint>/`, so engines of one model share pages through one
master and every other model misses them. Others may write to the store (another engine, the
run before a restart), so the tier asks the master about keys it has not seen itself.

Starting never hangs on a missing piece: no package, or no master listening at its address, is
a `HiCacheConfigError` naming it before the client is set up.
"""

from __future__ import annotations

import atexit
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from runtime import settings
from runtime.errors import HiCacheConfigError
from runtime.memory.tier_store import Buffer, StorageBackend

logger = logging.getLogger(__name__)

PACKAGE = "mooncake-transfer-engine-non-cuda"
SYSTEM_LIBS = "libibverbs1 librdmacm1"
PROTOCOLS = ("tcp", "rdma")
CONNECT_TIMEOUT_S = 3.0
KEY_PREFIX = "sgl-hicache"
_FIELD = "hicache_storage_backend_extra_config"
_UNITS = {"kb": 2**10, "mb": 2**20, "gb": 2**30, "tb": 2**40, "k": 2**10, "m": 2**20,
          "g": 2**30, "t": 2**40, "b": 1}  # fmt: skip


def parse_size(value: Any, name: str) -> int:
    """Bytes from an int or a text such as `4gb`, `512mb`, `1073741824`."""
    text = str(value).strip().lower()
    for unit, scale in _UNITS.items():
        if text.endswith(unit):
            text, factor = text[: -len(unit)].strip(), scale
            break
    else:
        factor = 1
    try:
        size = int(float(text) * factor)
    except ValueError:
        raise HiCacheConfigError(f"{name} must be a size in bytes (or 4gb, 512mb), got "
                                 f"{value!r}") from None  # fmt: skip
    if size < 0:
        raise HiCacheConfigError(f"{name} must not be negative, got {value!r}")
    return size


@dataclass(frozen=True, slots=True)
class MooncakeStoreConfig:
    """Where the master is and what this client lends and uses (SGLang's names)."""

    master_server_address: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: str
    local_hostname: str

    @classmethod
    def resolve(cls, extra: dict[str, Any]) -> MooncakeStoreConfig:
        """The extra-config keys, else the `MOONCAKE_*` variables, else the defaults; a key
        this backend does not know, or no master anywhere, is a HiCacheConfigError."""
        env = {
            "master_server_address": settings.MOONCAKE_MASTER,
            "metadata_server": settings.MOONCAKE_TE_META_DATA_SERVER,
            "global_segment_size": settings.MOONCAKE_GLOBAL_SEGMENT_SIZE,
            "local_buffer_size": settings.MOONCAKE_LOCAL_BUFFER_SIZE,
            "protocol": settings.MOONCAKE_PROTOCOL,
            "device_name": settings.MOONCAKE_DEVICE,
            "local_hostname": settings.MOONCAKE_LOCAL_HOSTNAME,
        }
        unknown = sorted(set(extra) - set(env))
        if unknown:
            raise HiCacheConfigError(
                f"{_FIELD}: the mooncake backend does not take {unknown} (it takes {sorted(env)})"
            )
        got = {key: extra[key] if key in extra else env[key].get() for key in env}
        if not got["master_server_address"]:
            raise HiCacheConfigError(
                f"hicache_storage_backend 'mooncake' needs a Mooncake master: set "
                f"master_server_address in {_FIELD} or MOONCAKE_MASTER (host:port of a running "
                f"`mooncake_master`)"
            )
        protocol = str(got["protocol"]).lower()
        if protocol not in PROTOCOLS:
            raise HiCacheConfigError(
                f"{_FIELD} protocol must be one of {list(PROTOCOLS)}, got {got['protocol']!r}"
            )
        return cls(
            master_server_address=str(got["master_server_address"]),
            metadata_server=str(got["metadata_server"]),
            global_segment_size=parse_size(got["global_segment_size"], "global_segment_size"),
            local_buffer_size=parse_size(got["local_buffer_size"], "local_buffer_size"),
            protocol=protocol,
            device_name=str(got["device_name"] or ""),
            local_hostname=str(got["local_hostname"]),
        )


def load_store_client() -> Any:
    """Mooncake Store's client class, or a HiCacheConfigError naming what is missing."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ModuleNotFoundError as exc:
        raise HiCacheConfigError(
            f"hicache_storage_backend 'mooncake' needs Mooncake Store's client: pip install "
            f"{PACKAGE} (scripts/install.sh installs it); {exc}"
        ) from exc
    except (ImportError, OSError) as exc:  # the package is there, a shared library is not
        raise HiCacheConfigError(
            f"hicache_storage_backend 'mooncake': the {PACKAGE} package is installed but a "
            f"system library it links is missing ({exc}); on Debian / Ubuntu: apt-get install "
            f"{SYSTEM_LIBS} (scripts/install.sh does)"
        ) from exc
    return MooncakeDistributedStore


def _listening(address: str, what: str, hint: str) -> None:
    """Raise a HiCacheConfigError unless something accepts TCP connections at `address`
    (`host:port`, or a URL with one)."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or not port:
        raise HiCacheConfigError(f"{what} must be host:port, got {address!r}")
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise HiCacheConfigError(
            f"hicache_storage_backend 'mooncake': no {what} reachable at {address} ({exc}); {hint}"
        ) from None


class MooncakeBackend(StorageBackend):
    """Page objects of one tier fingerprint in Mooncake Store."""

    authoritative = False

    def __init__(self, config: MooncakeStoreConfig, fingerprint: str) -> None:
        client_class = load_store_client()
        _listening(config.master_server_address, "Mooncake master (master_server_address)",
                   "start one: mooncake_master --rpc_port PORT")  # fmt: skip
        if config.metadata_server.startswith("http"):
            _listening(config.metadata_server, "Mooncake metadata server (metadata_server)",
                       "start one: mooncake_http_metadata_server, or use P2PHANDSHAKE")  # fmt: skip
        self.client = client_class()
        code = self.client.setup(
            config.local_hostname, config.metadata_server, config.global_segment_size,
            config.local_buffer_size, config.protocol, config.device_name,
            config.master_server_address,
        )  # fmt: skip
        if code != 0:
            self.client = None
            raise HiCacheConfigError(
                f"hicache_storage_backend 'mooncake': the Mooncake Store client did not start "
                f"(code {code}) with master {config.master_server_address}, metadata "
                f"{config.metadata_server}, protocol {config.protocol}"
            )
        # closed while Python runs even when the engine never gets to shut down (its start
        # failed later on): a native client left to the interpreter's exit may abort it
        atexit.register(self.close)
        self.prefix = f"{KEY_PREFIX}/{fingerprint}/"
        self.where = f"Mooncake Store (master {config.master_server_address})"
        logger.info("storage tier: %s, lending %.1f MiB", self.where,
                    config.global_segment_size / 2**20)  # fmt: skip

    def put(self, key: str, parts: Sequence[Buffer]) -> bool:
        code = self.client.put_parts(self.prefix + key, *parts)
        if code == 0:
            return True
        if self.client.is_exist(self.prefix + key) == 1:  # another writer was first
            return True
        logger.warning("storage tier: Mooncake put of %s failed (code %s)", key, code)
        return False

    def get(self, key: str) -> bytes | None:
        data = self.client.get(self.prefix + key)
        return data if data else None

    def exists(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        codes = self.client.batch_is_exist([self.prefix + key for key in keys])
        return [code == 1 for code in codes]

    def delete(self, key: str) -> None:
        self.client.remove(self.prefix + key, force=True)

    def close(self) -> None:
        atexit.unregister(self.close)
        client, self.client = self.client, None
        if client is not None:
            client.close()
