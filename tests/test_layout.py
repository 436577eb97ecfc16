"""The package layout: no import cycle, counting imports inside functions, and nothing imports upward.

Imports under ``if TYPE_CHECKING:`` (annotations only) are not run, so they are not counted.
The folders follow the data flow (README, "Layout"): cli -> io -> search -> simulate -> engines -> results ->
schedules / model -> core. The graph is read from the source with :mod:`ast` (no module is imported), so an import
inside a function counts like one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sim", "validate")

# sim's folders, lowest first: a module may import its own folder and any folder listed before it.
# The top-level modules sit where their job does: errors, limits, files and jit serve everything below io.
SIM_LEVELS = [
    {"sim.errors", "sim.limits", "sim.jit", "sim.files", "sim.moved"},
    {"sim.core"},
    {"sim.schedules", "sim.model"},
    {"sim.results"},
    {"sim.engines"},
    {"sim.simulate"},
    {"sim.search"},
    {"sim.io"},
    {"sim.cli", "sim.__main__", "sim"},
]

# Imports of sim.cli into validate or of validate into sim.cli kept lazy on purpose (import sim stays light):
# the CLI hands the `validate` and `ingest` subcommands to the validator.
LAZY_ALLOWED = {("sim.cli.ingest", "validate"), ("sim.cli.demo", "validate"), ("sim.cli.validate", "validate")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(node: ast.ImportFrom, name: str, path: Path) -> str:
    if node.level == 0:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[tuple[str, bool]]:
    """(imported project module, whether the import sits inside a function) for every import in *path*."""
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                continue  # read by type checkers only: never imported at run time
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name in modules:
                        found.add((alias.name, inner))
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(child, name, path)
                for alias in child.names:
                    target = f"{base}.{alias.name}"
                    if target in modules:  # `from sim.core import ir`: the module ir
                        found.add((target, inner))
                    elif base in modules:
                        found.add((base, inner))
            visit(child, inner)

    visit(tree, False)
    found.discard((name, False))
    found.discard((name, True))
    return found


def import_graph() -> dict[str, set[tuple[str, bool]]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph *edges*, as a list of modules, or None (iterative DFS, white-grey-black)."""
    state: dict[str, int] = {}
    for start in sorted(edges):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            for child in children:
                if state.get(child) == 1:
                    return path[path.index(child):] + [child]
                if not state.get(child):
                    state[child] = 1
                    stack.append((child, iter(sorted(edges.get(child, ())))))
                    path.append(child)
                    break
            else:
                state[node] = 2
                stack.pop()
                path.pop()
    return None


def level(module: str) -> int:
    """The data-flow level of a sim module (its folder's place in :data:`SIM_LEVELS`)."""
    if module == "sim":
        return len(SIM_LEVELS) - 1
    for i, group in enumerate(SIM_LEVELS):
        if any(module == p or module.startswith(p + ".") for p in group if p != "sim"):
            return i
    raise AssertionError(f"{module} sits in no level of the layout: place it in SIM_LEVELS")


def test_no_import_cycle_counting_imports_inside_functions():
    graph = {name: {target for target, _ in targets} for name, targets in import_graph().items()}
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {name: {target for target, _ in targets} for name, targets in import_graph().items()}
    graph["sim.core.keys"] = graph["sim.core.keys"] | {"sim.core.ir"}  # ir imports keys: closes a loop
    cycle = find_cycle(graph)
    assert cycle is not None and "sim.core.keys" in cycle and "sim.core.ir" in cycle


def test_sim_imports_nothing_upward():
    upward = []
    for name, targets in import_graph().items():
        if not name.startswith("sim"):
            continue
        own = level(name)
        for target, _ in targets:
            if target.startswith("sim") and target != "sim" and level(target) > own:
                upward.append(f"{name} -> {target}")
    assert not upward, "imports against the data flow:\n" + "\n".join(upward)


def test_sim_reaches_validate_only_lazily_from_the_cli():
    for name, targets in import_graph().items():
        if not name.startswith("sim"):
            continue
        for target, inside_function in targets:
            if target.split(".")[0] == "validate":
                assert inside_function and name.startswith("sim.cli."), f"{name} imports {target}"


def test_the_rank_side_imports_neither_the_cli_nor_the_orchestrator():
    orchestrator = {"validate.run", "validate.launch", "validate.command"}
    for name, targets in import_graph().items():
        if name.startswith("validate.rank"):
            for target, _ in targets:
                assert not target.startswith("sim.cli") and target not in orchestrator, f"{name} imports {target}"


@pytest.mark.parametrize("folder", ["core", "schedules", "model", "engines", "results", "search", "io", "cli"])
def test_every_folder_of_the_layout_is_a_package(folder):
    assert (ROOT / "sim" / folder / "__init__.py").is_file()
