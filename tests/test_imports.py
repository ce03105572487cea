"""Dependencies point one way: the import graph of src/growpipe, read with `ast` (nothing is imported).

The graph. Every .py file under src/growpipe is a node, named by its module (`growpipe.runtime.gpipe`; a
package's `__init__.py` is its own node, `growpipe.data`). Every import of growpipe code is an edge, wherever it
stands: at module level, under `if TYPE_CHECKING:` or `try:`, or inside a function. `import growpipe.a.b` and
`from growpipe.a.b import name` point at `growpipe.a.b`; `from growpipe.a import b` points at the submodule
`growpipe.a.b` when there is one, else at the package `growpipe.a`. Relative imports resolve the same way.
Importing `growpipe.a.b` runs `growpipe/a/__init__.py` first, so it also points at the package `growpipe.a`,
unless the importing module is inside that package (which is then already imported).

Rule 1, no cycles: no strongly connected component of more than one module (a module importing itself is
ignored). A failure lists cycles until every module of every component is on one, `a -> b -> c -> a`, each
with the import lines behind its edges.

Rule 2, lazy imports have a reason: an import statement inside a function (at any depth, including a class
inside a function) is allowed only if
  (a) everything it imports is an optional heavy third-party dependency: a module in HEAVY below or under one
      (`ray.serve._private.api`, `from ray import serve`), each listed there with its reason; or
  (b) a comment `# lazy: <reason>` gives the reason, on the statement's first line or on the line just above
      the run of consecutive import lines the statement is in.
Any other function-level import (the standard library, growpipe's own modules, light third-party packages)
belongs at the top of its module.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "growpipe"

HEAVY = {
    "mlflow": "seconds to import; only tracking, serving and sweeps need it",
    "matplotlib": "about a second; only plots",
    "torchvision": "pulls in torch._dynamo (seconds); only image backbones, augmentation and datasets",
    "datasets": "about a second; only Hugging Face sources",
    "transformers": "seconds; only Hugging Face models",
    "sklearn": "about a second; only the digits fallback and the classical baseline",
    "ray.serve": "seconds on top of ray; only growpipe serve",
    "ray.tune": "seconds on top of ray; only sweeps",
    "ray.train": "seconds on top of ray; only the DDP engine",
    "optuna": "only sweeps with search: optuna",
}
"""Optional heavy third-party dependencies (a module and everything under it) -> why they are imported late."""

LAZY_COMMENT = re.compile(r"#\s*lazy:\s*\S")


@dataclass(frozen=True)
class Import:
    """One import statement of growpipe code: where it is and what it imports."""

    module: str  # the importing module
    line: int
    end_line: int
    in_function: bool
    targets: tuple[str, ...]  # the dotted names it imports (modules, or module.name for `from m import name`)
    growpipe: tuple[str, ...]  # the growpipe modules (graph nodes) it points at, packages it runs first included


def module_names(src: Path) -> dict[str, Path]:
    """Every module of the package at `src`, dotted name -> file."""
    names = {}
    for path in sorted(src.rglob("*.py")):
        parts = (src.name, *path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` is, or lies in (its longest prefix that is a module); None outside the package."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a `from ... import` reads from."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def _with_packages(target: str, module: str, modules: dict[str, Path]) -> set[str]:
    """`target` and the packages importing it runs first: those around it that `module` is not in."""
    parts = target.split(".")
    packages = {".".join(parts[:end]) for end in range(1, len(parts))}
    return {target, *(p for p in packages if p in modules and not module.startswith(p + "."))}


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _base(node, module, is_package)
    return [f"{base}.{alias.name}" if alias.name != "*" else base for alias in node.names]


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every import statement in `path`, with the growpipe modules each points at."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                targets = _targets(child, module, is_package)
                # `from pkg import name`: the submodule pkg.name if there is one, else pkg itself
                resolved = {r for t in targets if (r := _resolve(t, modules))}
                nodes = set().union(*(_with_packages(r, module, modules) for r in resolved))
                found.append(Import(module, child.lineno, child.end_lineno or child.lineno, in_function, tuple(targets),
                                    tuple(sorted(nodes))))  # fmt: skip
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


def all_imports(src: Path) -> list[Import]:
    modules = module_names(src)
    return [imp for module, path in modules.items() for imp in imports_of(module, path, modules)]


def graph(imports: list[Import]) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first import of it}, self-imports left out."""
    edges: dict[str, dict[str, int]] = {}
    for imp in imports:
        for target in imp.growpipe:
            if target != imp.module:
                edges.setdefault(imp.module, {}).setdefault(target, imp.line)
    return edges


def components(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    nodes = sorted(set(edges) | {w for out in edges.values() for w in out})
    for v in nodes:
        if v not in index:
            connect(v)
    return sorted(found)


def shortest_cycle(start: str, members: set[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """The shortest cycle through `start` inside one component, as [start, ..., start]."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(edges.get(v, {})):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [*reversed(path), start]
            if w in members and w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError(f"{start} is in a component but on no cycle")


def cycle_report(edges: dict[str, dict[str, int]]) -> list[str]:
    """One line per cycle (`a -> b -> a`) until every member of every component is on one, each edge's line."""
    lines = []
    for members in components(edges):
        lines.append(f"{len(members)} modules import each other: {', '.join(members)}")
        covered: set[str] = set()
        for start in members:
            if start in covered:
                continue
            cycle = shortest_cycle(start, set(members), edges)
            covered.update(cycle)
            lines.append("  " + " -> ".join(cycle))
            lines += [f"    {a} line {edges[a][b]} imports {b}" for a, b in pairwise(cycle)]
    return lines


def _heavy(target: str) -> bool:
    return any(target == name or target.startswith(name + ".") for name in HEAVY)


def unexplained_lazy(imports: list[Import], src: Path) -> list[str]:
    """Function-level imports that neither import only HEAVY modules nor carry a `# lazy:` reason."""
    bad = []
    modules = module_names(src)
    lines_of: dict[str, list[str]] = {}
    import_lines: dict[str, set[int]] = {}
    for imp in imports:
        import_lines.setdefault(imp.module, set()).update(range(imp.line, imp.end_line + 1))
    for imp in imports:
        if not imp.in_function or all(_heavy(t) for t in imp.targets):
            continue
        lines = lines_of.setdefault(imp.module, modules[imp.module].read_text().splitlines())
        above = imp.line - 1
        while above in import_lines[imp.module]:  # the line above the run of import lines
            above -= 1
        here = lines[imp.line - 1]
        if not (LAZY_COMMENT.search(here) or (above >= 1 and LAZY_COMMENT.search(lines[above - 1]))):
            path = modules[imp.module].relative_to(src.parent)
            bad.append(f"{path}:{imp.line}: {here.strip()}")
    return bad


@functools.cache
def growpipe_imports() -> list[Import]:
    """Every import statement of src/growpipe (read once for both checks)."""
    return all_imports(SRC)


def test_no_import_cycles() -> None:
    """No module of growpipe reaches itself through imports, at module level or inside functions."""
    report = cycle_report(graph(growpipe_imports()))
    assert not report, "import cycles in src/growpipe:\n" + "\n".join(report)


def test_function_level_imports_have_a_reason() -> None:
    """An import inside a function is an optional heavy dependency or says why it is lazy (`# lazy: ...`)."""
    bad = unexplained_lazy(growpipe_imports(), SRC)
    assert not bad, (
        "imports inside functions without a reason: move them to the top of the module, or add "
        "`# lazy: <reason>` on the line or the line above (see tests/test_imports.py):\n" + "\n".join(bad)
    )


def test_the_checks_see_cycles_and_lazy_imports(tmp_path: Path) -> None:
    """The checks themselves on a small package: packages run first, relative imports, a cycle through an
    import inside a function, heavy dependencies and reasons."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "low.py": "import os\n\n\ndef f():\n    from pkg.sub import high  # lazy: only f needs it\n",
        "sub/__init__.py": "from .high import g\n",
        "sub/high.py": "from pkg import low\nfrom .. import low as again\n\n\ndef g():\n    import json\n",
        "heavy.py": "def h():\n    from ray import serve\n    import mlflow.tracking\n\n    # lazy: h is rare\n"
        "    import yaml\n    from pkg.sub import g\n    import numpy\n\n    import csv\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    imports = all_imports(pkg)
    edges = graph(imports)
    assert edges == {
        "pkg.low": {"pkg.sub": 5, "pkg.sub.high": 5},  # importing pkg.sub.high runs pkg/sub/__init__.py first
        "pkg.sub": {"pkg.sub.high": 1},
        "pkg.sub.high": {"pkg.low": 1},
        "pkg.heavy": {"pkg.sub": 7},
    }
    assert cycle_report(edges) == [
        "3 modules import each other: pkg.low, pkg.sub, pkg.sub.high",
        "  pkg.low -> pkg.sub.high -> pkg.low",
        "    pkg.low line 5 imports pkg.sub.high",
        "    pkg.sub.high line 1 imports pkg.low",
        "  pkg.sub -> pkg.sub.high -> pkg.low -> pkg.sub",
        "    pkg.sub line 1 imports pkg.sub.high",
        "    pkg.sub.high line 1 imports pkg.low",
        "    pkg.low line 5 imports pkg.sub",
    ]
    assert unexplained_lazy(imports, pkg) == ["pkg/heavy.py:10: import csv", "pkg/sub/high.py:6: import json"]


MAX_LINES = 600


def test_every_module_is_small() -> None:
    """One job per module: none reaches MAX_LINES (split it along its seams, as config/ and data/ were)."""
    big = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) >= MAX_LINES}
    assert not big, f"modules of {MAX_LINES}+ lines: {big}"


LOOP_MAX_LINES = 350


def test_the_run_loop_keeps_only_state_transitions() -> None:
    """loop/loop.py is the states and their transitions; growth, checkpoints, failures and the end are components
    of their own (loop/growing.py, checkpointing.py, recovery.py, ending.py), each with its tests."""
    lines = len((SRC / "loop" / "loop.py").read_text().splitlines())
    assert lines <= LOOP_MAX_LINES, f"loop/loop.py has {lines} lines (at most {LOOP_MAX_LINES}): move work out"
