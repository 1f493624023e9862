"""The fleet's pinned environment (cloud/fleet.lock, cloud/fleet_lock.py) and the node setup that
installs it once (cloud/node_setup.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from cloud import fleet_lock, node_setup, sky
from spotlight.config import to_yaml

from conftest import small_dit_config

ROOT = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    lines = [line for line in fleet_lock.LOCK.read_text().splitlines() if line and not line.startswith("#")]
    pins = {}
    for line in lines:
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==" and "+" not in spec.version, line  # exact, no local build label
        pins[canonicalize_name(req.name)] = spec.version
    return pins


def test_the_lock_pins_every_runtime_dependency_and_nothing_for_tests():
    pins = _pins()
    pyproject = (ROOT / "pyproject.toml").read_text()
    import tomllib

    project = tomllib.loads(pyproject)["project"]
    for dep in project["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pins and req.specifier.contains(pins[name]), (dep, pins.get(name))
    for tool in ("pytest", "pytest-timeout", "moto", "xfuser"):
        assert tool not in pins, tool
    assert "gpu" not in project.get("optional-dependencies", {})  # nothing imports xfuser


def test_the_lock_is_this_environment(capsys):
    """The test environment is installed with the lock as constraints (Makefile): what the tests
    ran on is what the nodes run."""
    assert fleet_lock.main(["--check"]) == 0, capsys.readouterr().err


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _fake_uv(path: Path, version: str, calls: Path) -> None:
    """A `uv` that records its calls; `uv venv DIR` makes DIR/bin/python."""
    _executable(path, f"""#!/bin/sh
[ "$1" = --version ] && {{ echo "uv {version} (fake)"; exit 0; }}
echo "uv-{version} $*" >> {calls}
if [ "$1" = venv ]; then for a; do dir=$a; done; mkdir -p "$dir/bin"; printf '#!/bin/sh\\n' > "$dir/bin/python"
  chmod +x "$dir/bin/python"; fi
""")


@pytest.mark.parametrize("uv_from", ["path", "pip", "installer"])
def test_a_node_installs_the_lock_once(tmp_path, uv_from):
    """The node's setup run for real with fake `uv`, `python3` and `curl`: the pinned uv is used
    (found on PATH, else installed with the image's pip, else with uv's installer), the virtualenv
    is made with the pinned Python and gets the lock, once; another lock, or no virtualenv, redoes it."""
    work, home, bin_, calls = tmp_path / "workdir", tmp_path / "home", tmp_path / "bin", tmp_path / "calls"
    (work / "cloud").mkdir(parents=True)  # SkyPilot's copy of the repository
    (work / "cloud" / "fleet.lock").write_text(fleet_lock.LOCK.read_text())
    home.mkdir()
    pinned = node_setup.UV_VERSION
    _fake_uv(bin_ / "uv", pinned if uv_from == "path" else "0.4.0", calls)
    _fake_uv(tmp_path / "uv-pinned", pinned, calls)
    user_bin = home / ".local" / "bin"  # where `pip install --user` and uv's installer put it
    pip_works = uv_from == "pip"
    _executable(bin_ / "python3", f"#!/bin/sh\necho \"python3 $*\" >> {calls}\n"
                + (f"mkdir -p {user_bin} && cp {tmp_path / 'uv-pinned'} {user_bin}/uv\n" if pip_works else "exit 1\n"))
    _executable(bin_ / "curl", f"#!/bin/sh\necho \"curl $*\" >> {calls}\n"
                f"echo 'mkdir -p \"$UV_INSTALL_DIR\" && cp {tmp_path / 'uv-pinned'} \"$UV_INSTALL_DIR/uv\"'\n")
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_}:{os.environ['PATH']}"}

    def run() -> list[str]:
        subprocess.run(["bash", "-c", node_setup.SETUP], cwd=work, env=env, check=True, timeout=30)
        lines = calls.read_text().splitlines() if calls.exists() else []
        calls.unlink(missing_ok=True)
        return lines

    venv = home / ".spotlight-venv"
    install = [f"uv-{pinned} venv --quiet --clear --managed-python --python {node_setup.PYTHON} {venv}",
               f"uv-{pinned} pip install --quiet --python {venv}/bin/python -r cloud/fleet.lock",
               f"uv-{pinned} pip install --quiet --python {venv}/bin/python --no-deps -e ."]
    bootstrap = {"path": [],
                 "pip": [f"python3 -m pip install --quiet --user uv=={pinned}"],
                 "installer": [f"python3 -m pip install --quiet --user uv=={pinned}",
                               f"curl -LsSf https://astral.sh/uv/{pinned}/install.sh"]}[uv_from]
    assert run() == bootstrap + install
    assert (home / ".spotlight-fleet.lock").read_text() == fleet_lock.LOCK.read_text()
    assert run() == []  # set up again on the same node, or an image built with SETUP: nothing
    (work / "cloud" / "fleet.lock").write_text(fleet_lock.LOCK.read_text() + "extra==1.0\n")
    assert run() == install  # another lock: a new virtualenv, with the pinned uv installed before
    shutil.rmtree(venv)
    assert run() == install  # the lock installed but no virtualenv (an image from the system pip)

    where = ["bash", "-c", node_setup.ACTIVATE + 'echo "$(command -v python)" "${VIRTUAL_ENV:-}"']
    assert subprocess.run(where, env=env, capture_output=True, text=True, check=True).stdout.split() == [
        f"{venv}/bin/python", str(venv)]
    shutil.rmtree(venv)  # no virtualenv (a test's local "node"): PATH as it is
    out = subprocess.run(where, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == [p for p in [shutil.which("python", path=env["PATH"])] if p]


def test_requires_python_and_the_lock_agree():
    """Every pin's Requires-Python (installed here) admits every Python that pyproject admits."""
    python = SpecifierSet(fleet_lock.requires_python())
    pins = [line for line in fleet_lock.LOCK.read_text().splitlines() if not line.startswith("#")]
    assert fleet_lock.python_conflicts(python, fleet_lock.installed_requires_python(pins)) == []
    assert fleet_lock.admitted_pythons(python)[0] == node_setup.PYTHON.rsplit(".", 1)[0]  # the nodes': the lowest
    # What the check catches: a pin refusing one patch release, or a range open to later Pythons.
    (conflict,) = fleet_lock.python_conflicts(SpecifierSet(">=3.11,<3.15"), {"networkx==3.6.1": "!=3.14.1,>=3.11"})
    assert conflict.startswith("networkx==3.6.1: Requires-Python !=3.14.1,>=3.11 refuses Python 3.14.1,"), conflict
    assert fleet_lock.admitted_pythons(SpecifierSet(">=3.11,!=3.14.1,<3.15")) == ["3.11", "3.12", "3.13", "3.14"]
    with pytest.raises(ValueError, match="no upper bound"):
        fleet_lock.admitted_pythons(SpecifierSet(">=3.11"))


@pytest.fixture(scope="module")
def pypi() -> None:
    """PyPI, which the nodes install from: skipped where it cannot be reached, except under CI."""
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10).close()
    except OSError as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI checks the lock against PyPI, but cannot reach it: {e}")
        pytest.skip(f"checking the lock against PyPI needs PyPI: {e}")


@pytest.mark.slow  # ~20 s a version here (pip fetches the metadata of ~140 wheels)
@pytest.mark.parametrize("python", fleet_lock.admitted_pythons(SpecifierSet(fleet_lock.requires_python())))
def test_the_lock_installs_from_wheels_on_every_admitted_python(pypi, tmp_path, python):
    """`pip install --dry-run --only-binary=:all: --python-version X -r cloud/fleet.lock` resolves,
    against PyPI, to exactly the pins plus torch's CUDA dependencies (no pin missing, none
    resolved differently, nothing else floating for this Python)."""
    # Only PyPI: a machine's pip configuration may add a local index or a CPU torch (this one's
    # /opt/wheels has torch 2.13.0+cpu for 3.11), which is not what a node gets.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")}
    env["PIP_CONFIG_FILE"] = os.devnull
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--only-binary=:all:",
                           "--python-version", python, "--target", str(tmp_path / "target"),
                           "--index-url", "https://pypi.org/simple", "--report", str(report),
                           "-r", str(fleet_lock.LOCK)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = {canonicalize_name(i["metadata"]["name"]): i for i in json.loads(report.read_text())["install"]}
    pins = _pins()
    assert {n: resolved[n]["metadata"]["version"] for n in pins if n in resolved} == pins
    assert all(i["download_info"]["url"].startswith("https://files.pythonhosted.org/") for i in resolved.values())
    # Beyond the lock: only what torch's PyPI build needs and the CPU build here does not (CUDA).
    cuda, todo = set(), ["torch"]
    while todo:
        for r in resolved[todo.pop()]["metadata"].get("requires_dist", []):
            if (name := canonicalize_name(Requirement(r).name)) in resolved and name not in cuda and name not in pins:
                cuda.add(name)
                todo.append(name)
    assert set(resolved) - set(pins) == cuda, sorted(set(resolved) - set(pins) - cuda)


def test_a_node_image_goes_on_every_task(tmp_path):
    cfg = small_dit_config(runtime={"kind": "ray", "spot_workers": 2}, cloud={"image_id": "docker:spotlight:0.1"})
    (fleet,) = sky.write_tasks(cfg.cloud, 2, to_yaml(cfg), tmp_path, "r")
    tasks = list(yaml.safe_load_all(fleet.read_text()))[1:]
    assert [t["resources"]["image_id"] for t in tasks] == ["docker:spotlight:0.1"] * 3
    with pytest.raises(Exception, match="image_id"):
        small_dit_config(cloud={"image_id": "two words"})
