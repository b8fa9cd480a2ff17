"""The layout's rules, checked on the source (README, "Layout"):

* no import cycle among the five packages, counting imports inside functions;
* serving code (``model/*.py``, ``server/``, ``audio/``) never imports build, training
  or benchmark code, and imports torch only inside the two PyTorch engines' loader;
* nothing outside ``tests/`` imports ``tests``.

``python -m tests.test_layout`` prints the import graph's cycles, if any.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("server", "model", "audio", "export", "clients")
# The command line registers every command (export, train, bench): it is the one
# composition root allowed to reach build and training code.
COMMAND_LINE = {"server.cli"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {
        module_name(p): p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if ".venv" not in p.parts
    }


def imports(name: str, path: Path) -> Iterator[tuple[str, bool]]:
    """``(imported module, at module level)`` for every import in the file."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}", id(node) in top
                yield base, id(node) in top


def graph() -> dict[str, set[str]]:
    """Edges between the packages' own modules (``from a import b`` counts a.b when b
    is a module, else a)."""
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for target, _ in imports(name, path):
            if target in mods and target != name:
                edges[name].add(target)
    # a package's __init__ is empty here: importing a.b does not pass through it
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


def serving(name: str) -> bool:
    top = name.split(".")
    if name in COMMAND_LINE:
        return False
    if top[0] == "model":
        return len(top) == 2  # model/*.py; model.nn and model.training are not
    return top[0] in ("server", "audio") and name != "audio.speech"


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_serving_never_imports_build_training_or_benchmarks() -> None:
    bad = [
        (name, target)
        for name, path in modules().items()
        if serving(name)
        for target, _ in imports(name, path)
        if target.split(".")[0] == "export" or target.startswith(("model.training", "tests"))
    ]
    assert bad == []


def test_serving_imports_torch_only_in_the_pytorch_engines() -> None:
    """Serving modules may reach torch only through ``model.nn.engines``, imported
    inside the function that loads a PyTorch engine; at module level, never."""
    mods = modules()
    bad = []
    for name, path in mods.items():
        if not serving(name):
            continue
        for target, at_top in imports(name, path):
            if target.split(".")[0] == "torch":
                bad.append((name, target))
            elif target.startswith("model.nn"):
                engines = target.partition(".load_")[0] == "model.nn.engines"
                if at_top or not engines:
                    bad.append((name, target))
    assert bad == []


def test_build_and_the_network_never_import_training() -> None:
    """Training builds on the network and on export, never the other way round."""
    bad = [
        (name, target)
        for name, path in modules().items()
        if name.startswith(("export", "model.nn"))
        for target, _ in imports(name, path)
        if target.startswith("model.training")
    ]
    assert bad == []


def test_nothing_outside_tests_imports_tests() -> None:
    bad = [
        (name, target)
        for name, path in modules().items()
        for target, _ in imports(name, path)
        if target.split(".")[0] == "tests"
    ]
    assert bad == []


def test_the_checker_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


if __name__ == "__main__":
    found = cycles(graph())
    for comp in found:
        print(" <-> ".join(comp))
    print(f"{len(found)} import cycles among {len(modules())} modules")
    sys.exit(1 if found else 0)
