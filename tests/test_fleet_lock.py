"""The fleet's pinned environment (cloud/fleet.lock, cloud/fleet_lock.py) and the node setup that
installs it once."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from cloud import fleet_lock, sky
from spotlight.config import to_yaml

from conftest import small_dit_config

ROOT = Path(__file__).resolve().parents[1]


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


def test_a_node_installs_the_lock_once(tmp_path):
    (fleet,) = sky.write_tasks(small_dit_config(runtime={"kind": "ray", "spot_workers": 1}).cloud, 1,
                               to_yaml(small_dit_config()), tmp_path / "tasks", "r")
    setup = list(yaml.safe_load_all(fleet.read_text()))[1]["setup"]
    work = tmp_path / "workdir"  # SkyPilot's copy of the repository
    (work / "cloud").mkdir(parents=True)
    (work / "cloud" / "fleet.lock").write_text(fleet_lock.LOCK.read_text())
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "pip-calls"
    (bin_ / "pip").write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n")
    (bin_ / "pip").chmod(0o755)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PATH": f"{bin_}:{os.environ['PATH']}"}
    (tmp_path / "home").mkdir()

    def run():
        subprocess.run(["bash", "-c", setup], cwd=work, env=env, check=True, timeout=30)
        return calls.read_text().splitlines() if calls.exists() else []

    assert run() == ["install --quiet -r cloud/fleet.lock", "install --quiet --no-deps -e ."]
    assert (tmp_path / "home" / ".spotlight-fleet.lock").read_text() == fleet_lock.LOCK.read_text()
    assert len(run()) == 2  # set up again on the same node, or an image built from the lock: nothing
    (work / "cloud" / "fleet.lock").write_text(fleet_lock.LOCK.read_text() + "extra==1.0\n")
    assert len(run()) == 4  # another lock: installed again


def test_a_node_image_goes_on_every_task(tmp_path):
    cfg = small_dit_config(runtime={"kind": "ray", "spot_workers": 2}, cloud={"image_id": "docker:spotlight:0.1"})
    (fleet,) = sky.write_tasks(cfg.cloud, 2, to_yaml(cfg), tmp_path, "r")
    tasks = list(yaml.safe_load_all(fleet.read_text()))[1:]
    assert [t["resources"]["image_id"] for t in tasks] == ["docker:spotlight:0.1"] * 3
    with pytest.raises(Exception, match="image_id"):
        small_dit_config(cloud={"image_id": "two words"})
