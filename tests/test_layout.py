"""The code's shape: packages by layer, imports running one way.

A module may import from its own package and from the layers below it, never from one above,
and no chain of imports, lazy ones inside functions included, comes back to where it started.
A failure names the arrow that goes the wrong way."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import softeval

SOURCE = Path(softeval.__file__).parent

# lowest first; the base modules (errors, _io, _lazy, _memo, _charts, progress) serve every layer
LAYERS = ["base", "formats", "models", "tasks", "engine", "scoring", "tuning", "analysis", "reports", "study", "loop", "testbed", "cli"]
BASE = {"errors", "_io", "_lazy", "_memo", "_charts", "progress"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str | None:
    """The layer of `softeval.x...`; None for the package itself (the public API, over all)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return "base" if parts[1] in BASE else parts[1]


def imports(path: Path) -> set[str]:
    """The softeval modules a file imports, anywhere in it: lazy imports and imports made only
    for type checkers too (a circle that only annotations close is still parts reaching into
    each other)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "softeval":
            for alias in node.names:  # `from softeval.x import y` imports the module softeval.x.y where there is one
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if _is_module(candidate) else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "softeval"}
    return found


def _is_module(name: str) -> bool:
    path = SOURCE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def graph() -> dict[str, set[str]]:
    """module -> the softeval modules it imports. A package's `__init__` whose `EXPORTS` name what
    its modules offer (imported on first use) imports those modules."""
    edges = {module_name(p): imports(p) for p in SOURCE.rglob("*.py")}
    for path in SOURCE.rglob("__init__.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EXPORTS" for t in node.targets):
                package = module_name(path)
                edges[package] |= {f"{package}.{module}" for module in ast.literal_eval(node.value).values()}
    return edges


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Every arrow from a module to one of a higher layer (or to the public API over them all)."""
    upward = []
    for module, targets in sorted(edges.items()):
        if layer(module) is None:
            continue
        for target in sorted(targets):
            if layer(target) is None or LAYERS.index(layer(target)) > LAYERS.index(layer(module)):
                upward.append(f"{module} -> {target}")
    return upward


def cycles(edges: dict[str, set[str]]) -> list[str]:
    """Each chain of imports that comes back to its start, once."""
    done, on_path, found = set(), [], []

    def visit(module: str) -> None:
        if module in on_path:
            found.append(" -> ".join(on_path[on_path.index(module):] + [module]))
            return
        if module in done:
            return
        on_path.append(module)
        for target in sorted(edges.get(module, ())):
            visit(target)
        on_path.pop()
        done.add(module)

    for module in sorted(edges):
        visit(module)
    return found


def test_every_module_belongs_to_a_layer():
    unknown = sorted(m for m in graph() if layer(m) is not None and layer(m) not in LAYERS)
    assert not unknown, f"modules outside the layers {LAYERS}: {unknown}; add the package to LAYERS where it belongs"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = upward_imports(graph())
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def test_imports_have_no_cycles():
    found = cycles(graph())
    assert not found, "import cycles:\n" + "\n".join(found)


def test_the_checks_see_an_arrow_the_wrong_way_and_a_cycle(tmp_path, monkeypatch):
    """A lower layer importing a higher one (lazily, inside a function) is found, and so is the
    cycle it closes through the higher package's exports."""
    fake = tmp_path / "softeval"
    for package in ("formats", "study"):
        (fake / package).mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "formats" / "__init__.py").write_text("")
    (fake / "formats" / "bad.py").write_text("def f():\n    from softeval.study import run_study\n")
    (fake / "study" / "__init__.py").write_text('EXPORTS = {"run_study": "runner"}\n')
    (fake / "study" / "runner.py").write_text("from softeval.formats import bad\n")
    monkeypatch.setattr(sys.modules[__name__], "SOURCE", fake)
    edges = graph()
    assert upward_imports(edges) == ["softeval.formats.bad -> softeval.study"]
    assert cycles(edges) == ["softeval.formats.bad -> softeval.study -> softeval.study.runner -> softeval.formats.bad"]


def test_a_circle_closed_only_by_type_annotations_is_found(tmp_path, monkeypatch):
    """Parts that reach into each other through `if TYPE_CHECKING:` imports still form a circle."""
    fake = tmp_path / "softeval"
    (fake / "engine").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "engine" / "__init__.py").write_text("")
    (fake / "engine" / "steps.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from softeval.engine.whole import Whole\n")
    (fake / "engine" / "whole.py").write_text("from softeval.engine.steps import step\n")
    monkeypatch.setattr(sys.modules[__name__], "SOURCE", fake)
    assert cycles(graph()) == ["softeval.engine.steps -> softeval.engine.whole -> softeval.engine.steps"]
