"""The pinned environment of a launched fleet's nodes: `cloud/fleet.lock`.

Every node of a fleet installs the same versions — the ones this repository is tested with — so a
spot node recovered after a new Ray release still runs the head's Ray (Ray refuses a node of
another version). A node's setup (cloud/node_setup.py) installs the lock into a virtualenv of its
own, then this repository without its dependencies (`--no-deps`). The lock is the runtime closure
of the project's dependencies (no extras, no test tools) with the versions installed here, local
build labels dropped (`torch 2.13.0+cpu` is pinned `torch==2.13.0`: on a GPU node PyPI's build of
the same version is the CUDA one). So nothing is resolved at launch but that build's CUDA
dependencies, which the CPU build here does not have: torch pins most of them itself
(`nvidia-cudnn-cu13==9.20.0.48`), not `cuda-bindings` (`>=13.0.3,<14`) and `cuda-pathfinder`.

The lock and pyproject's `requires-python` agree: every pin admits every Python version the project
admits (`python_conflicts`, checked here from the installed distributions' `Requires-Python`), and
every pin has a wheel for each admitted minor version (tests/cloud/test_fleet_lock.py resolves the lock
with pip for each, against PyPI). The same pins serve every admitted version: the dry runs resolve
nothing beyond the lock but torch's CUDA dependencies, so no environment markers are needed.

    python -m cloud.fleet_lock            # write cloud/fleet.lock from this environment
    python -m cloud.fleet_lock --check    # exit 1, naming what differs, if it is out of date
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

LOCK = Path(__file__).resolve().parent / "fleet.lock"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
PROJECT = "spotlight"
HEADER = ("# The fleet's nodes install exactly these (cloud/fleet_lock.py): the runtime dependencies of\n"
          "# spotlight as tested. Regenerate with `python -m cloud.fleet_lock` after changing them.\n")


def _applies(req: Requirement, extras: frozenset[str]) -> bool:
    """Whether `req` is needed by a distribution installed with `extras` (its environment markers)."""
    if req.marker is None:
        return True
    env = default_environment()
    return any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))


def runtime_pins(project: str = PROJECT) -> list[str]:
    """`name==version` of every distribution the project's runtime needs, as installed here,
    sorted by name; a dependency that is not installed raises `metadata.PackageNotFoundError`."""
    visited: set[tuple[str, frozenset[str]]] = set()
    versions: dict[str, str] = {}
    todo = [req for r in metadata.requires(project) or [] if _applies(req := Requirement(r), frozenset())]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in visited:
            continue
        visited.add(key)
        dist = metadata.distribution(req.name)
        versions[key[0]] = dist.version.split("+", 1)[0]
        todo += [sub for r in dist.requires or [] if _applies(sub := Requirement(r), key[1])]
    return [f"{name}=={version}" for name, version in sorted(versions.items())]


def requires_python(pyproject: Path = PYPROJECT) -> str:
    """The project's `requires-python`, read from pyproject.toml (the installed metadata may be older)."""
    return tomllib.loads(pyproject.read_text())["project"]["requires-python"]


def admitted_pythons(spec: SpecifierSet) -> list[str]:
    """The minor versions `X.Y` of Python 3 that `spec` admits at least one release of, e.g. `>=3.11,<3.15`:
    `['3.11', '3.12', '3.13', '3.14']`; an open-ended `spec` raises `ValueError` (a lock has wheels
    for the versions that exist, not for every later one)."""
    if spec.contains("3.999"):
        raise ValueError(f"requires-python {spec} has no upper bound: it would admit Pythons no pin has wheels for")
    return [f"3.{m}" for m in range(100) if any(spec.contains(f"3.{m}.{p}") for p in range(100))]


def python_conflicts(spec: SpecifierSet, pins_requires_python: Mapping[str, str | None]) -> list[str]:
    """`name: Requires-Python X refuses Python V` for each pin whose `Requires-Python` (by pin) refuses
    a version `spec` admits. Checked on each admitted `X.Y.0` and on each version a pin's specifier
    names (`networkx 3.6.1: !=3.14.1,>=3.11` is checked on 3.14.1): exact for `>=`, `<`, `!=`, `==`."""
    named = {Version(s.version.removesuffix(".*")) for rp in pins_requires_python.values() if rp
             for s in SpecifierSet(rp)}
    candidates = sorted({Version(v) for v in admitted_pythons(spec)} | {v for v in named if spec.contains(v)})
    return [f"{pin}: Requires-Python {rp} refuses Python {v}, which requires-python {spec} admits"
            for pin, rp in sorted(pins_requires_python.items()) if rp
            for v in candidates if spec.contains(v) and not SpecifierSet(rp).contains(v)]


def installed_requires_python(pins: list[str]) -> dict[str, str | None]:
    """`name==version` -> that distribution's `Requires-Python`, as installed here."""
    return {pin: metadata.metadata(pin.split("==", 1)[0])["Requires-Python"] for pin in pins}


def lock_text(project: str = PROJECT, python: str | None = None) -> str:
    """The lock of `project` as installed here, for the Pythons `python` (default: pyproject's requires-python)."""
    python = requires_python() if python is None else python
    return (HEADER + f"# For Python {python} (requires-python in pyproject.toml).\n"
            + "".join(f"{pin}\n" for pin in runtime_pins(project)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cloud.fleet_lock", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only compare: exit 1 if cloud/fleet.lock is out of date")
    args = p.parse_args(argv)
    python = requires_python()
    text = lock_text(python=python)
    pins = [line for line in text.splitlines() if not line.startswith("#")]
    conflicts = python_conflicts(SpecifierSet(python), installed_requires_python(pins))
    for conflict in conflicts:
        print(f"{LOCK}: {conflict}: narrow requires-python or change the pin", file=sys.stderr)
    if args.check:
        have = LOCK.read_text() if LOCK.exists() else ""
        if have != text:
            old, new = set(have.splitlines()), set(text.splitlines())
            print(f"{LOCK}: out of date: -{sorted(old - new)} +{sorted(new - old)}", file=sys.stderr)
            return 1
        return 1 if conflicts else 0
    LOCK.write_text(text)
    print(f"wrote {LOCK} ({len(pins)} pins)")
    return 1 if conflicts else 0


if __name__ == "__main__":
    sys.exit(main())
