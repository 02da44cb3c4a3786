"""docs/configuration.md's tables, generated from the packages' settings modules.

    python scripts/settings_doc.py           # rewrite the tables in docs/configuration.md
    python scripts/settings_doc.py --check   # exit 1 if the page differs from the settings

Each table sits between `<!-- settings: PACKAGE -->` and `<!-- end settings -->`; the prose
around them is the page's own. tests/project/test_settings.py runs the check.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

from grammar.settings import markdown_table

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "configuration.md"
PACKAGES = ("grammar", "runtime", "sgl_dsl")
_BLOCK = re.compile(r"(<!-- settings: (\w+) -->\n)(.*?)(<!-- end settings -->)", re.S)


def render(page: str) -> str:
    """`page` with every settings block replaced by its package's table."""

    def table(m: re.Match[str]) -> str:
        module = importlib.import_module(f"{m.group(2)}.settings")
        return m.group(1) + markdown_table(module.SETTINGS) + m.group(4)

    return _BLOCK.sub(table, page)


def blocks(page: str) -> list[str]:
    """The packages whose settings blocks `page` holds, in order."""
    return [m.group(2) for m in _BLOCK.finditer(page)]


def main(argv: list[str]) -> int:
    text = PAGE.read_text(encoding="utf-8")
    want = render(text)
    if "--check" in argv:
        if want != text:
            print(f"{PAGE} differs from the settings modules: run python {__file__}")
            return 1
        return 0
    PAGE.write_text(want, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
