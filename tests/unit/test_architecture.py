"""The layout of the package is its architecture (docs/architecture.md): parts in folders, and
imports that run one way only, from the top (the programs) down to the shared leaves.

Every `import` counts, a lazy one inside a function too: a part that reaches up, even late,
is tied to what sits above it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "container_entry"
TOP = "top"  # the package's own modules: the programs, the job, the scripts' API
# part -> the parts it may import (besides itself)
ALLOWED = {
    "common": set(),
    "diagnose": {"common"},
    "plan": {"common", "diagnose"},
    "rank": {"common", "diagnose", "plan"},
    "hosts": {"common", "diagnose", "plan"},
    "supervise": {"common", "diagnose", "plan", "rank", "hosts"},
    TOP: {"common", "diagnose", "plan", "rank", "hosts", "supervise"},
}
MAX_TOP_MODULES = 10
MAX_LINES = 400
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that `path` imports, anywhere in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in known else base)
    return {m for m in found if m in known and m != name}


def part_of(module: str) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 2 or (len(pieces) == 2 and pieces[1] in ALLOWED) else TOP


GRAPH = {name: imported(path, modules()) for name, path in modules().items()}


def test_imports_run_one_way_from_the_top_down_to_the_shared_leaves():
    wrong = sorted(
        f"{module} imports {target} ({part_of(module)} may not import {part_of(target)})"
        for module, targets in GRAPH.items()
        for target in targets
        if part_of(target) != part_of(module) and part_of(target) not in ALLOWED[part_of(module)]
    )
    assert not wrong, "\n".join(wrong)


def test_every_part_is_a_folder_that_says_what_it_owns_and_may_import():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(ALLOWED) - {TOP}
    for part in folders:
        text = ast.get_docstring(ast.parse((PACKAGE / part / "__init__.py").read_text())) or ""
        assert "May import:" in text, f"{part}/__init__.py says what it may import"
        named = re.sub(r"\([^)]*\)", "", text.split("May import:", 1)[1]).split(".", 1)[0]
        said = set(re.findall(r"[a-z_]+", named)) - {"nothing"}
        assert said == ALLOWED[part], (part, named)


def test_the_top_level_is_small():
    top = [p.name for p in PACKAGE.glob("*.py")]
    assert len(top) <= MAX_TOP_MODULES, top


def test_no_import_circles():
    """No module reaches itself through the imports of others (lazy ones included)."""
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            cycle = " -> ".join([*path[path.index(module) :], module])
            pytest.fail(f"import circle: {cycle}")
        if module in done:
            return
        for target in sorted(GRAPH[module]):
            if not (target == module.rpartition(".")[0] and module in GRAPH[target]):
                visit(target, (*path, module))
        done.add(module)

    for module in sorted(GRAPH):
        visit(module, ())


@pytest.mark.parametrize("root", ["container_entry", "scripts"])
def test_no_module_or_function_is_too_long_to_read(root):
    long = []
    for path in sorted((REPO / root).rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_LINES:
            long.append(f"{path.relative_to(REPO)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {size}")
    for path in sorted((REPO / root).rglob("*.sh")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            long.append(f"{path.relative_to(REPO)}: {lines} lines")
    assert not long, "\n".join(long)
