"""The layout's rules, checked on the source (README, "Layout"):

* every module imports only what its folder's row of the README's Layout table allows
  in the "may import" column, counting imports inside functions;
* no import cycle among modules, nor among packages;
* serving code (``model/*.py``, ``server/``, ``audio/``) never imports build, training,
  benchmark or command-line code, and imports torch only inside the two PyTorch
  engines' loader;
* nothing outside ``tests/`` imports ``tests``; every package is type-checked and in
  the wheel.

``python -m tests.test_layout`` prints the import graph's cycles and every import the
table does not allow.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


@dataclass(frozen=True)
class Row:
    """A row of the README's Layout table: a folder as a module prefix, and the modules
    (with what lies below them) that its code may import besides its own."""

    package: str
    may_import: tuple[str, ...]


def layout_table(text: str) -> list[Row]:
    """The rows of the "### Layout" table. In the "may import" cell the names in
    backticks count, except inside parentheses, which explain; ``tests/`` (which may
    import anything) is left out. A row it cannot read is an error, not a row less."""
    section = text.split("### Layout", 1)[1].split("\n#", 1)[0]
    lines = [line.strip() for line in section.splitlines() if line.startswith("|")]
    rows = []
    for line in lines[2:]:  # after the header and its rule
        cells = [c.strip() for c in line.strip("|").split("|")]
        folder = re.fullmatch(r"`([a-z_/]+)/`", cells[0])
        if len(cells) != 3 or folder is None:
            raise ValueError(f"README, Layout: not a row of three cells: {line}")
        if folder[1] != "tests":
            allowed = re.findall(r"`([a-z_.]+)`", re.sub(r"\([^)]*\)", "", cells[2]))
            rows.append(Row(folder[1].replace("/", "."), tuple(allowed)))
    return rows


ROWS = layout_table(README.read_text())
PACKAGES = tuple(dict.fromkeys(row.package.split(".")[0] for row in ROWS))


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
                module = f"{base}.{alias.name}"
                yield (module if is_module(module) else base), id(node) in top


def is_module(name: str) -> bool:
    """Whether a dotted name is a module or package of this checkout."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


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
    if top[0] == "model":
        return len(top) == 2  # model/*.py; model.nn and training are not
    return top[0] in ("server", "audio") and name != "audio.speech"


def row_of(module: str, rows: list[Row] = ROWS) -> Row | None:
    """The row of the innermost folder that holds the module."""
    found = [r for r in rows if within(module, r.package)]
    return max(found, key=lambda r: len(r.package), default=None)


def within(module: str, name: str) -> bool:
    return module == name or module.startswith(name + ".")


def allowed(module: str, target: str, rows: list[Row] = ROWS) -> bool:
    """Whether the table lets ``module`` import ``target``: a module of its own row, or
    one below a name of its "may import" cell and in that name's row (``model`` opens
    model/*.py, not model/nn/, which has a row of its own)."""
    own, theirs = row_of(module, rows), row_of(target, rows)
    if own is None or theirs is None:
        return False
    return theirs == own or any(
        within(target, name) and row_of(name, rows) == theirs for name in own.may_import
    )


def disallowed() -> list[tuple[str, str]]:
    """``(module, imported module)`` for every import of ours the table does not allow."""
    return sorted(
        {
            (name, target)
            for name, path in modules().items()
            for target, _ in imports(name, path)
            if target.split(".")[0] in PACKAGES and not allowed(name, target)
        }
    )


def package(module: str) -> str:
    return module.split(".")[0]


def package_graph() -> dict[str, set[str]]:
    """Edges between packages: one wherever a module of one imports a module of another."""
    edges: dict[str, set[str]] = {package(m): set() for m in modules()}
    for name, targets in graph().items():
        edges[package(name)] |= {package(t) for t in targets} - {package(name)}
    return edges


def test_every_import_is_one_the_layout_table_allows() -> None:
    assert disallowed() == []


def test_every_package_has_a_row_and_every_row_a_folder() -> None:
    found = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert found == set(PACKAGES)
    assert [r.package for r in ROWS if not ROOT.joinpath(*r.package.split(".")).is_dir()] == []


def test_the_table_reader_and_the_rule() -> None:
    text = (
        "### Layout\n\n| folder | what | may import |\n|---|---|---|\n"
        "| `a/` | the `x.py` | `b.c`, `d` (not `e`) |\n| `a/f/` | f | nothing of ours |\n"
        "| `b/` | b | `a` |\n| `d/` | d | `a.f` |\n| `tests/` | tests | anything |\n\n## Next\n"
    )
    rows = layout_table(text)
    assert rows == [Row("a", ("b.c", "d")), Row("a.f", ()), Row("b", ("a",)), Row("d", ("a.f",))]
    with pytest.raises(ValueError, match="not a row"):
        layout_table(text.replace("| f |", "| f | g |"))
    assert allowed("a.x", "b.c.y", rows) and allowed("a.x", "d.z", rows)
    assert allowed("a.x", "a.y", rows) and allowed("d.x", "a.f.g", rows)
    assert not allowed("a.x", "b.z", rows)  # only b.c is named
    assert not allowed("a.f.x", "a.y", rows)  # a/f/ has its own row: a is not its own
    assert not allowed("b.x", "a.f.g", rows)  # `a` opens a's row, not a/f/'s
    assert not allowed("a.x", "e.y", rows) and not allowed("x.y", "a.b", rows)


def test_every_package_is_type_checked_and_in_the_wheel() -> None:
    """README's command 2 and .ci/run run mypy on every package, strict; the wheel holds
    every package."""
    for path in (README, ROOT / ".ci" / "run"):
        runs = re.findall(r"mypy((?: [a-z_]+)+)", path.read_text())
        assert runs and all(set(r.split()) == set(PACKAGES) for r in runs), (path, runs)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert set(include) == {f"{p}*" for p in PACKAGES}
    (strict,) = project["tool"]["mypy"]["overrides"]
    assert strict["strict"] and set(strict["module"]) == {f"{p}.*" for p in PACKAGES}


def test_no_import_cycles_between_packages() -> None:
    assert cycles(package_graph()) == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_serving_never_imports_build_training_or_benchmarks() -> None:
    bad = [
        (name, target)
        for name, path in modules().items()
        if serving(name)
        for target, _ in imports(name, path)
        if target.split(".")[0] in ("export", "bench", "cli", "tests")
        or target.startswith("training")
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
        if target.startswith("training")
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
    found = cycles(graph()) + cycles(package_graph())
    for comp in found:
        print(" <-> ".join(comp))
    bad = disallowed()
    for name, target in bad:
        print(f"{name} imports {target}: not in its row of README's Layout table")
    print(f"{len(found)} import cycles among {len(modules())} modules and their packages")
    sys.exit(1 if found or bad else 0)
