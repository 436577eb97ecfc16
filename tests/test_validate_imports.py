"""The validator's module graph: no import cycles (lazy imports inside functions included), and the
modules the command line and the ingest side load before torch stay torch-free."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "validate"


def _graph() -> dict[str, set[str]]:
    mods = {p.stem for p in PACKAGE.glob("*.py")}
    graph = {}
    for name in mods:
        deps = set()
        for node in ast.walk(ast.parse((PACKAGE / f"{name}.py").read_text())):  # every import, lazy ones too
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
                elif node.module and node.module.startswith("validate."):
                    deps.add(node.module.split(".")[1])
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(n, path):
        state[n] = 1
        for d in sorted(graph[n]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state:
                found = visit(d, path + [d])
                if found:
                    return found
        state[n] = 2
        return None
    for n in sorted(graph):
        if n not in state:
            found = visit(n, [n])
            if found:
                return found
    return None


def test_the_validator_has_no_import_cycle():
    graph = _graph()
    assert "worker" not in graph["comparison"] and "command" not in graph["comparison"]
    assert _cycle(graph) is None, _cycle(graph)


def test_the_cycle_finder_finds_one():
    assert _cycle({"command": {"comparison"}, "comparison": {"worker"}, "worker": {"command"}}) == [
        "command", "comparison", "worker", "command"]


def test_torch_free_modules_stay_torch_free():
    code = ("import sys, validate.command, validate.request, validate.errors, validate.compare, validate.report; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    assert subprocess.run([sys.executable, "-c", code], timeout=120, cwd=PACKAGE.parent).returncode == 0
