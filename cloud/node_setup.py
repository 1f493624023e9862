"""A launched node's environment: a virtualenv with a pinned, uv-managed Python holding `cloud/fleet.lock`.

`SETUP` is every node's setup script (its working directory is this repository); `ACTIVATE` is the
line each node's run script starts with. Invariants:

- The node's Python is never the image's: GCP's default GPU image is Ubuntu 22.04 (Python 3.10, which
  the lock's numpy 2.4.6 refuses) and SkyPilot 0.14.1 installs no conda. `SETUP` installs a pinned
  `uv`, which downloads CPython `PYTHON` (python-build-standalone) and makes `NODE_VENV` with it;
  the lock and this repository (`--no-deps -e .`) are installed there; nothing is resolved but the
  CUDA wheels of PyPI's torch 2.13.0 (cloud/fleet_lock.py says which float).
- Idempotent: a node whose `INSTALLED_LOCK` equals `cloud/fleet.lock` and whose `NODE_VENV` exists
  installs nothing — setup run again on the same disk after a recovery, or an image built by running
  `SETUP` once (`cloud.image_id`). Another lock rebuilds the virtualenv from scratch (`--clear`), so
  no distribution of an older lock survives. `INSTALLED_LOCK` is written last: a setup cut short
  is redone. (tests/cloud/test_fleet_lock.py: `test_a_node_installs_the_lock_once`.)
- `ACTIVATE` puts `NODE_VENV/bin` first on PATH when it exists and changes nothing otherwise, so the
  same run scripts work from a plain PATH (the tests run them as local processes).
"""

from __future__ import annotations

NODE_VENV = "~/.spotlight-venv"
"""The node's virtualenv: `spotlight`, `ray` and `python` of a launched node."""
INSTALLED_LOCK = "~/.spotlight-fleet.lock"
"""The lock `NODE_VENV` was installed from (an image built with `SETUP` carries it)."""
UV_VERSION = "0.13.9"
"""The uv that makes the node's environment."""
PYTHON = "3.11.18"
"""The nodes' Python: the minor version the tests run on (3.11, the lowest pyproject's
requires-python admits), at the newest patch uv `UV_VERSION` can download."""


def _home(path: str) -> str:
    """`path` with its `~` spelled `$HOME`: expanded inside double quotes and after `=` alike."""
    return path.replace("~", "$HOME", 1)


_VENV, _LOCK = _home(NODE_VENV), _home(INSTALLED_LOCK)

SETUP = (
    "set -euo pipefail\n"
    f"if ! cmp -s cloud/fleet.lock \"{_LOCK}\" || ! [ -x \"{_VENV}/bin/python\" ]; then\n"
    # Where both `pip install --user` and uv's installer put `uv`.
    "  export PATH=\"$HOME/.local/bin:$PATH\"\n"
    f"  if [ \"$(uv --version 2>/dev/null | cut -d' ' -f2)\" != {UV_VERSION} ]; then\n"
    # From PyPI, which the lock needs anyway; where the image's Python has no pip, or refuses a
    # user install (PEP 668: Ubuntu 24.04, Debian 12), uv's standalone installer of the same version.
    f"    python3 -m pip install --quiet --user uv=={UV_VERSION} 2>/dev/null \\\n"
    f"      || curl -LsSf https://astral.sh/uv/{UV_VERSION}/install.sh \\\n"
    "         | env UV_INSTALL_DIR=\"$HOME/.local/bin\" UV_NO_MODIFY_PATH=1 sh\n"
    "  fi\n"
    f"  uv venv --quiet --clear --managed-python --python {PYTHON} \"{_VENV}\"\n"
    # On a GPU node PyPI's torch of the pinned version is the CUDA build, which is what it needs.
    f"  uv pip install --quiet --python \"{_VENV}/bin/python\" -r cloud/fleet.lock\n"
    f"  uv pip install --quiet --python \"{_VENV}/bin/python\" --no-deps -e .\n"
    f"  cp cloud/fleet.lock \"{_LOCK}\"\n"
    "fi\n"
)
"""A node's setup script (bash; its working directory is this repository)."""

ACTIVATE = (f"if [ -x \"{_VENV}/bin/python\" ]; then "
            f"export VIRTUAL_ENV=\"{_VENV}\" PATH=\"{_VENV}/bin:$PATH\"; fi\n")
"""The first line of a node's run script: the commands it runs come from `NODE_VENV` where it exists."""
