"""The layout of the project's packages (grammar, runtime, sgl_dsl), read from source; the
import graph and its cycles also over the benchmarks (``graph(packages=BENCHMARKS)``).

The import graph: every ``import`` / ``from ... import`` counts, those inside functions and those
under ``if TYPE_CHECKING:`` too (a type-only import still ties two modules' concepts together,
and a reader meets it as a dependency). An edge goes to the module a statement names (``from a.b
import c`` counts ``a.b.c`` when that is a module, else ``a.b``); importing a package runs its
``__init__``, so ``a.b``'s ``__init__`` is an edge too.

Beside the graph: functions longer than a limit, reads of the process environment outside a
package's ``settings.py``, and modules that ``docs/ARCHITECTURE.md`` does not name.

    python scripts/import_graph.py   # everything it finds, one line each (benchmarks: cycles)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("grammar", "runtime", "sgl_dsl")
BENCHMARKS = ("benchmarks",)  # not a layer of the product: only its own graph is checked


def modules(repo: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """{dotted module name: file} of every .py file of the packages (``__init__``: the package)."""
    out = {}
    for pkg in packages:
        for path in sorted((repo / pkg).rglob("*.py")):
            parts = path.relative_to(repo).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(tree: ast.Module, module: str, is_package: bool, mods: dict) -> set[str]:
    """The modules of ``mods`` whose code this module's import statements run or read."""
    out: set[str] = set()
    own_packages = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}

    def add_module(name: str) -> None:
        # importing a.b.c runs a/__init__ and a/b/__init__ first; for a module inside a, those
        # have already started running, so they are not dependencies of it
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in mods and (prefix == name or prefix not in own_packages):
                out.add(prefix)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                add_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                if f"{prefix}.{alias.name}" in mods:
                    add_module(f"{prefix}.{alias.name}")
                elif prefix in mods:
                    # a name defined by prefix's own code (a package's __init__ included)
                    add_module(prefix)
                    out.add(prefix)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    out.discard(module)
    return out


def graph(repo: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """{module: modules of the packages it imports} (a module never lists itself); imports of
    modules outside ``packages`` are left out."""
    mods = modules(repo, packages)
    return {
        name: _imports(ast.parse(path.read_text(encoding="utf-8")), name,
                       path.name == "__init__.py", mods)
        for name, path in mods.items()
    }  # fmt: skip


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return sorted(out)


def folder_sizes(repo: Path = REPO) -> dict[str, int]:
    """{folder: number of .py modules directly in it (``__init__`` not counted)}."""
    sizes: dict[str, int] = {}
    for path in modules(repo).values():
        if path.name != "__init__.py":
            folder = str(path.parent.relative_to(repo))
            sizes[folder] = sizes.get(folder, 0) + 1
    return sizes


def long_files(limit: int, repo: Path = REPO) -> dict[str, int]:
    """{file: lines} of the modules longer than ``limit`` lines (a prompt to look, not a rule)."""
    out = {}
    for path in modules(repo).values():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > limit:
            out[str(path.relative_to(repo))] = n
    return out


def long_functions(limit: int, repo: Path = REPO) -> dict[str, int]:
    """{"module:qualified.name": lines} of every function or method longer than ``limit`` lines
    (decorators not counted; a nested function counts inside its parent and on its own)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}."
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                n = child.end_lineno - child.lineno + 1
                if n > limit:
                    out[f"{module}:{name[:-1]}"] = n
            visit(child, module, name)

    for module, path in modules(repo).items():
        visit(ast.parse(path.read_text(encoding="utf-8")), module, "")
    return out


def env_reads(repo: Path = REPO) -> dict[str, list[int]]:
    """{module: line numbers} of every use of the process environment (``os.environ``,
    ``os.getenv``, ``os.putenv``, ``os.unsetenv``, or those names imported from ``os``) outside
    the package's own ``settings`` module (``grammar.settings``, ``runtime.settings``, ...)."""
    names = {"environ", "getenv", "putenv", "unsetenv", "environb", "getenvb"}
    out: dict[str, list[int]] = {}
    for module, path in modules(repo).items():
        if module.split(".")[1:] == ["settings"]:
            continue
        lines = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in names
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
            ):
                lines.add(node.lineno)
            elif isinstance(node, ast.ImportFrom) and node.module == "os":
                if any(alias.name in names for alias in node.names):
                    lines.add(node.lineno)
        if lines:
            out[module] = sorted(lines)
    return out


def _named_words(doc: str) -> set[str]:
    """The words inside `code spans` of a markdown text (`a/b.py` gives a, b, py)."""
    words: set[str] = set()
    for span in re.findall(r"`([^`\n]+)`", doc):
        words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span))
    return words


def unnamed_modules(repo: Path = REPO, doc: str = "docs/ARCHITECTURE.md") -> list[str]:
    """The modules (and sub-packages) whose own name appears in no `code span` of ``doc``
    (``__main__`` entry points and the top-level packages are exempt)."""
    words = _named_words((repo / doc).read_text(encoding="utf-8"))
    out = []
    for module in modules(repo):
        last = module.rsplit(".", 1)[-1]
        if "." in module and last != "__main__" and last not in words:
            out.append(module)
    return out


def main() -> int:
    edges = graph()
    found = cycles(edges)
    found += cycles(graph(packages=BENCHMARKS))
    for comp in found:
        print("cycle:", " <-> ".join(comp))
    for name, n in sorted(long_functions(120).items()):
        print(f"{n:5d} lines  function {name}")
    for module, lines in sorted(env_reads().items()):
        print(f"environment read outside settings: {module} lines {lines}")
    for module in unnamed_modules():
        print(f"not named in docs/ARCHITECTURE.md: {module}")
    for path, n in sorted(long_files(600).items()):
        print(f"{n:5d} lines  {path} (past 600: is it still one concept?)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
