"""The layout's two rules, checked on the source (every import statement, a function's lazy ones
included — a lazy import is still a dependency):
- imports point down: `schedulers/`, `planners/`, `cloud/` and `elastic_sp/` never import `spotlight/`
  (each owns the config section it reads, or takes plain values; `spotlight.config.RunConfig`
  composes the sections);
- no two modules depend on each other, directly or through others (no import cycles);
- inside `spotlight/`, no two packages (or top-level modules) depend on each other either: the floors
  stand on each other one way only — `config`, `text`, `waiting`, `logs`, `rl` at the bottom; `iteration`
  and `checkpoints` on them; `runtime` and `sim` next; `train` on `runtime`; `run_results`, `bench`
  and `cli` at the top (`FLOORS`, checked by `test_spotlight_floors_point_down`).
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


def _sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of nodes of `graph` that depend on each other (strongly connected, more than one)."""
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
    return cycles


def test_no_import_cycles():
    assert not (cycles := _sccs(_graph())), f"modules that depend on each other: {cycles}"


def _floor_of(module: str) -> str | None:
    """`spotlight.train.trainer` -> `train`; `spotlight.cli` -> `cli`; None outside spotlight/."""
    parts = module.split(".")
    return parts[1] if parts[0] == "spotlight" and len(parts) > 1 else None


FLOORS = {"config": 0, "text": 0, "waiting": 0, "logs": 0, "install_torch": 0, "reward_names": 0, "dit_presets": 0,
          "device_constants": 0,
          "rl": 1, "memory_estimate": 1, "launch_config": 1, "fleet_node": 1, "iteration": 2, "checkpoints": 2, "runtime": 3, "sim": 3,
          "train": 4, "run_results": 5, "bench": 5, "cli": 6}
"""Each package (or top-level module) of `spotlight/` and its floor: it may import its own floor's
others only if that makes no cycle, and any lower floor; never a higher one."""


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, deps in _graph().items():
        if (floor := _floor_of(module)) is None:
            continue
        graph.setdefault(floor, set()).update(f for d in deps if (f := _floor_of(d)) not in (None, floor))
    return graph


def test_spotlight_packages_do_not_depend_on_each_other():
    """Package level, as `test_no_import_cycles` checks modules: `train` importing `runtime` while
    `runtime` imports `train` is a cycle even when no two modules form one."""
    assert not (cycles := _sccs(_package_graph())), f"packages of spotlight/ that depend on each other: {cycles}"


def test_spotlight_floors_point_down():
    graph = _package_graph()
    assert set(graph) == set(FLOORS), f"give each package of spotlight/ a floor in FLOORS: {sorted(set(graph) ^ set(FLOORS))}"
    upward = sorted(f"{p} (floor {FLOORS[p]}) imports {d} (floor {FLOORS[d]})"
                    for p, deps in graph.items() for d in deps if FLOORS[d] > FLOORS[p])
    assert not upward, "imports inside spotlight/ must point down:\n" + "\n".join(upward)


def test_the_check_sees_what_it_should():
    """The graph finds the imports it must judge: a lazy import inside a function counts."""
    graph = _graph()
    assert "schedulers.queue" in graph["schedulers.fleet"] or "schedulers.request" in graph["schedulers.fleet"]
    assert "spotlight.config" in graph["spotlight.cli"]
    assert "spotlight.sim.simulator" in graph["spotlight.cli"]  # imported inside cmd_simulate
    # a cycle of two packages is found, and so is an import up a floor
    assert _sccs({"train": {"runtime"}, "runtime": {"train"}, "sim": set()}) == [["runtime", "train"]]
    assert "runtime" in _package_graph()["train"]
