"""The pinned environment of a launched fleet's nodes: `cloud/fleet.lock`.

Every node of a fleet installs the same versions — the ones this repository is tested with — so a
spot node recovered after a new Ray release still runs the head's Ray (Ray refuses a node of
another version), and a node's setup is `pip install -r cloud/fleet.lock` plus this repository
without its dependencies (`--no-deps`), nothing resolved at launch. The lock is the runtime
closure of the project's dependencies (no extras, no test tools) with the versions installed here,
local build labels dropped (`torch 2.13.0+cpu` is pinned `torch==2.13.0`: on a GPU node PyPI's
build of the same version is the CUDA one).

    python -m cloud.fleet_lock            # write cloud/fleet.lock from this environment
    python -m cloud.fleet_lock --check    # exit 1, naming what differs, if it is out of date
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

LOCK = Path(__file__).resolve().parent / "fleet.lock"
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


def lock_text(project: str = PROJECT) -> str:
    return HEADER + "".join(f"{pin}\n" for pin in runtime_pins(project))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cloud.fleet_lock", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only compare: exit 1 if cloud/fleet.lock is out of date")
    args = p.parse_args(argv)
    text = lock_text()
    if args.check:
        have = LOCK.read_text() if LOCK.exists() else ""
        if have != text:
            old, new = set(have.splitlines()), set(text.splitlines())
            print(f"{LOCK}: out of date: -{sorted(old - new)} +{sorted(new - old)}", file=sys.stderr)
            return 1
        return 0
    LOCK.write_text(text)
    print(f"wrote {LOCK} ({len(text.splitlines()) - 2} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
