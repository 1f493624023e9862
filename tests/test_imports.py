"""The layout's two rules, checked on the source (every import statement, a function's lazy ones
included — a lazy import is still a dependency):
- imports point down: `schedulers/`, `planners/`, `cloud/` and `elastic_sp/` never import `spotlight/`
  (each owns the config section it reads, or takes plain values; `spotlight.config.RunConfig`
  composes the sections);
- no two modules depend on each other, directly or through others (no import cycles).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("spotlight", "schedulers", "planners", "cloud", "elastic_sp", "experiments")
LOWER = ("schedulers", "planners", "cloud", "elastic_sp")


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (an imported name that is a module counts as that module)."""
    modules = _modules()

    def module_of(dotted: str) -> str | None:
        parts = dotted.split(".")
        return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules), None)

    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            deps |= {m for t in targets if (m := module_of(t)) is not None and m != name}
        graph[name] = deps
    return graph


def test_lower_packages_never_import_spotlight():
    upward = sorted(f"{m} imports {d}" for m, deps in _graph().items() for d in deps
                    if m.split(".")[0] in LOWER and d.split(".")[0] == "spotlight")
    assert not upward, "imports must point down:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, f"modules that depend on each other: {cycles}"


def test_the_check_sees_what_it_should():
    """The graph finds the imports it must judge: a lazy import inside a function counts."""
    graph = _graph()
    assert "schedulers.queue" in graph["schedulers.fleet"] or "schedulers.request" in graph["schedulers.fleet"]
    assert "spotlight.config" in graph["spotlight.cli"]
    assert "spotlight.sim.simulator" in graph["spotlight.cli"]  # imported inside cmd_simulate
