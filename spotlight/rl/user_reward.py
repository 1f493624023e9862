"""A user's reward: a Python callable of theirs, named in the config as `package.module:name` (an
importable module) or `path/to/file.py:name` (a file, relative to the working directory of
`spotlight train`).

It is called as `f(outputs, prompts, metadata)` once per request — the G samples of one prompt
(`RewardWorker` scores each request on its own, so how requests are split between reward
workers changes no score):
- `outputs`: a DiT's images as a list of RGB `PIL.Image`s (from `Rollout.images` in [0, 1],
  x255 and rounded), or an LLM's completions as a list of strings;
- `prompts`: the prompt strings, one per sample;
- `metadata`: each sample's prompt metadata dict (a jsonl prompt's other fields; `{}` for a txt line);
and returns one finite float per sample: a list, tuple, numpy array or tensor. Anything else, an
exception or a hang is handled by `RewardWorker` (tried once more, then a `RewardError`).

`check` (run by `spotlight train` before anything starts) only looks, running none of the user's
code: the file exists or the module can be found, its source parses, and it binds the name at its
top level (`defines`: a def, class, assignment or import of it; a star import or a module
`__getattr__` may bind anything, so either passes). `load` imports it and takes the callable; every failure of either is one
`ConfigError` line naming the config field and what was expected.

On Ray, the reward workers import the function themselves: a file path is made absolute against
the controller's working directory, so the file must exist at that path on the worker's node (it
does on the controller's, where reward workers without GPUs run); a module must be importable
there (installed, or on the PYTHONPATH the workers inherit).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from schedulers.input.files import short
from spotlight.config import ConfigError, RewardConfig
from spotlight.reward_names import component_field


def parse(spec: str) -> tuple[str, str, bool]:
    """`spec` as (module or file, attribute, whether it is a file)."""
    target, _, name = spec.rpartition(":")
    return target, name, target.endswith(".py")


def _file(target: str, cwd: str | Path | None) -> Path:
    path = Path(target)
    return path if path.is_absolute() else Path(cwd if cwd is not None else Path.cwd()) / path


def _find(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or one that is not a package
        return False


def check(spec: str, field: str, cwd: str | Path | None = None) -> None:
    """Without importing anything of the user's: the file of `spec` exists, or its module can be
    found (importing its parent packages, as finding a module does). `ConfigError` naming `field`."""
    target, name, is_file = parse(spec)
    if is_file:
        path: Path | None = _file(target, cwd)
        if not path.is_file():
            start = "" if Path(target).is_absolute() else ", a path from the working directory"
            raise ConfigError(f"{field}: {short(target)} is not an existing file (expected the Python file of "
                              f"{short(spec)}{start})")
    else:
        if not _find(target):
            raise ConfigError(f"{field}: no module {target!r} can be imported (expected an installed module or one "
                              "on PYTHONPATH; for a file of yours write path/to/file.py:name)")
        path = _source(target)
    if path is not None and not defines(path, name, field, target):
        raise ConfigError(f"{field}: {short(target)} defines no {name!r} at its top level (expected a function "
                          f"of it named {name})")


MAX_SOURCE_BYTES = 16 << 20
"""Most bytes of a reward's source read to look for its name (16 MiB); a larger file is imported
unchecked (its import says what is wrong)."""


def _source(module: str) -> Path | None:
    """The .py file `module` is loaded from; None for a compiled or built-in one (not looked into)."""
    try:
        origin = importlib.util.find_spec(module).origin  # found by `_find` already
    except (ImportError, ValueError, AttributeError):
        return None
    return Path(origin) if origin and origin.endswith(".py") else None


def defines(path: Path, name: str, field: str, target: str) -> bool:
    """Whether the source at `path` binds `name` at its top level, read without running it; True
    when it cannot tell (a star import, a module `__getattr__`, an unreadable or huge file). A
    source that does not parse is a ConfigError naming its line."""
    try:
        if path.stat().st_size > MAX_SOURCE_BYTES:
            return True
        source = path.read_bytes()
    except OSError:
        return True
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as err:
        raise ConfigError(f"{field}: {short(target)} line {err.lineno}: {err.msg} (expected Python that "
                          "parses)") from None
    except (ValueError, RecursionError, MemoryError):  # NUL bytes, nesting too deep for the parser
        return True
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in (name, "__getattr__"):
                return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*" or (alias.asname or alias.name.split(".")[0]) == name:
                    return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                return True
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
            bound = ([node.target] if isinstance(node, (ast.For, ast.AsyncFor))
                     else [i.optional_vars for i in node.items if i.optional_vars is not None])
            if any(isinstance(n, ast.Name) and n.id == name for t in bound for n in ast.walk(t)):
                return True
        if any(isinstance(n, ast.NamedExpr) and n.target.id == name for n in ast.walk(node)):
            return True
    return False


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements that run at a module's top level, those inside if/try/with/for/while included
    (a name bound under `if HAVE_TORCH:` or `try: ... except ImportError:` is the module's)."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        for attr in ("body", "orelse", "finalbody"):
            inner = getattr(node, attr, None)
            if isinstance(inner, list) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                  ast.ClassDef)):
                out.extend(_top_level(inner))
        for handler in getattr(node, "handlers", []) or []:
            out.extend(_top_level(handler.body))
        for case in getattr(node, "cases", []) or []:
            out.extend(_top_level(case.body))
    return out


def check_config(cfg: RewardConfig, cwd: str | Path | None = None) -> None:
    """`check` every user function of `cfg`."""
    for i, term in enumerate(cfg.terms):
        if term.function is not None:
            check(term.function, component_field(cfg, i, "function"), cwd)


def _import_file(path: Path) -> Any:
    # A name of its own per file (its path's hash), registered before it runs: dataclasses and
    # pickling look a module up in sys.modules by name.
    name = f"spotlight_user_reward_{path.stem}_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load(spec: str, field: str, cwd: str | Path | None = None) -> Callable[..., Any]:
    """The callable `spec` names, imported (a file: by path, relative to `cwd`). `ConfigError`
    naming `field` when the file or module is missing, fails to import, lacks the name, or the
    name is not callable."""
    check(spec, field, cwd)
    target, name, is_file = parse(spec)
    try:
        module = _import_file(_file(target, cwd)) if is_file else importlib.import_module(target)
    except Exception as err:  # noqa: BLE001 — the user's module may raise anything while it loads
        text = " ".join(str(err).split())[:200]
        raise ConfigError(f"{field}: importing {target} raised {type(err).__name__}: {text} (expected a module "
                          f"that imports cleanly)") from None
    if not hasattr(module, name):
        raise ConfigError(f"{field}: {target} has no {name!r} (expected a function of it named {name})")
    fn = getattr(module, name)
    if not callable(fn):
        raise ConfigError(f"{field}: {target}:{name} is a {type(fn).__name__}, not callable (expected a function "
                          "f(outputs, prompts, metadata))")
    return fn


class UserReward:
    """A user's function as a `rewards.Reward`: decodes the rollout's outputs, calls it, and hands
    back what it returned as it is (`rewards.as_scores` checks it)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, rollout: Any) -> Any:
        from spotlight.rl.reward_inputs import pil_images  # torch: only where rewards are scored

        if rollout.images is not None:
            outputs: list[Any] = pil_images(rollout.images)
        elif rollout.completions is not None:
            outputs = list(rollout.completions)
        else:
            raise ValueError("the rollout has neither images nor completions to score")
        return self.fn(outputs, [p.text for p in rollout.prompts], [dict(p.metadata) for p in rollout.prompts])
