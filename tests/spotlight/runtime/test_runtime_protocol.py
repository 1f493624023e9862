"""The one door (`spotlight.runtime.protocol.Runtime`): both runtimes have every member the protocol
declares, and the controller's code (`spotlight/train/`) uses no member of a runtime that the
protocol does not declare — checked on the source, so that a new call through the side door fails
here rather than only on the runtime that lacks it."""

import ast
import inspect
from pathlib import Path

from spotlight.runtime.local import LocalRuntime
from spotlight.runtime.protocol import Runtime
from spotlight.runtime.ray_runtime import RayRuntime

REPO = Path(__file__).resolve().parents[3]


def _declared() -> set[str]:
    members = {name for name, _ in inspect.getmembers(Runtime) if not name.startswith("_")}
    return members | set(Runtime.__annotations__)


def test_both_runtimes_have_every_member_the_protocol_declares():
    for runtime in (LocalRuntime, RayRuntime):
        built = inspect.getsource(runtime.build)  # members the roles' start assigns (the engine, ...)
        missing = sorted(m for m in _declared() if not hasattr(runtime, m) and f"self.{m} =" not in built)
        assert not missing, f"{runtime.__name__} lacks {missing}"


def _is_config(node: ast.AST) -> bool:
    """`cfg.runtime`, `self.cfg.runtime`: the config section, not a runtime."""
    return (isinstance(node, ast.Attribute) and node.attr == "runtime"
            and (getattr(node.value, "id", None) == "cfg" or getattr(node.value, "attr", None) == "cfg"))


def _runtime_uses(path: Path) -> set[str]:
    """Attributes read of an expression named `runtime` or `rt` (`self.runtime.x`, `rt.x`,
    `tr.runtime.x`), the config section `runtime` and local names bound to it aside."""
    tree = ast.parse(path.read_text())
    config_names = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _is_config(node.value)
                    for t in node.targets if isinstance(t, ast.Name)}
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not _is_config(node.value):
            inner = node.value
            name = inner.attr if isinstance(inner, ast.Attribute) else getattr(inner, "id", None)
            if name in ("runtime", "rt") and not (isinstance(inner, ast.Name) and inner.id in config_names):
                used.add(node.attr)
    return used


def test_the_controller_uses_only_what_the_protocol_declares():
    files = sorted((REPO / "spotlight" / "train").glob("*.py"))
    used = {m: f.name for f in files for m in _runtime_uses(f)}
    assert {"engine", "build", "update"} <= set(used)  # the check sees the calls it must judge
    extra = sorted(f"{used[m]}: runtime.{m}" for m in set(used) - _declared())
    assert not extra, "members used that the Runtime protocol does not declare:\n" + "\n".join(extra)
