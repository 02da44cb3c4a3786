"""Check that the running environment holds what a lock file pins.

    python scripts/lock_check.py requirements.lock     # exit 1 listing every difference

A locked package that is missing or at another version is a difference; packages the lock does
not name (a developer's extra tools) are not.
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.utils import canonicalize_name


def read_lock(path: str) -> dict[str, str]:
    """{canonical name: version} from ``name==version`` lines (comments and blanks skipped)."""
    pins = {}
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            name, sep, version = line.partition("==")
            if not sep or not version.strip():
                raise ValueError(f"{path}:{number}: expected name==version, got {line!r}")
            pins[canonicalize_name(name.strip())] = version.strip()
    return pins


def differences(pins: dict[str, str]) -> list[str]:
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}
    out = []
    for name, version in sorted(pins.items()):
        have = installed.get(name)
        if have != version:
            out.append(f"{name}: locked {version}, installed {have or 'nothing'}")
    return out


def main(argv: list[str]) -> int:
    path = argv[1] if len(argv) > 1 else "requirements.lock"
    diff = differences(read_lock(path))
    for line in diff:
        print(f"lock_check: {line}", file=sys.stderr)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
