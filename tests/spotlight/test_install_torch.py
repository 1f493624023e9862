"""spotlight/install_torch.py: which torch build a machine gets, decided without a network.

The decision is driven with made-up findings and resolutions; the GPU detection with a fake
`nvidia-smi` on PATH and a fake /proc; pip itself runs only in `--dry-run` against this machine's
local wheel folders (`--isolated`, explicit `file://` sources: no configured index is asked).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotlight import install_torch
from spotlight.install_torch import (
    DEFAULT_CPU_INDEX,
    TORCH_REQUIREMENT,
    GpuFinding,
    ResolvedPackage,
    choose_install,
    cuda_packages,
    detect_nvidia_gpu,
    parse_pip_report,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "spotlight" / "install_torch.py"

# What pip resolved torch==2.13.0 to (pip 26.3, Python 3.11, Linux x86_64, 2026-11), trimmed:
# PyPI's build, and this machine's local CPU wheel.
PYPI_CUDA_RESOLUTION = [
    ResolvedPackage("torch", "2.13.0"),
    ResolvedPackage("cuda-toolkit", "13.0.3.0"),
    ResolvedPackage("nvidia-cudnn-cu13", "9.20.0.48"),
    ResolvedPackage("nvidia-nccl-cu13", "2.29.7"),
    ResolvedPackage("triton", "3.7.1"),
    ResolvedPackage("nvidia-cublas", "13.1.1.3"),
    ResolvedPackage("filelock", "4.3.1"),
    ResolvedPackage("sympy", "1.14.0"),
]
CPU_RESOLUTION = [
    ResolvedPackage("torch", "2.13.0+cpu"),
    ResolvedPackage("filelock", "4.0.8"),
    ResolvedPackage("sympy", "1.14.0"),
    ResolvedPackage("typing_extensions", "4.16.0"),
]
NO_GPU = GpuFinding(False, "nvidia-smi absent")
A_GPU = GpuFinding(True, "nvidia-smi -L lists 1 GPU(s)")


class RecordingResolver:
    """A stand-in for the pip dry run: returns a fixed resolution and counts how often it was asked."""

    def __init__(self, resolution):
        self.resolution = resolution
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return self.resolution


# The decision.


def test_a_gpu_gets_the_configured_registrys_build_without_a_dry_run():
    resolver = RecordingResolver(PYPI_CUDA_RESOLUTION)
    plan = choose_install(A_GPU, None, resolver)
    assert plan.pip_args == ("install", TORCH_REQUIREMENT)
    assert resolver.calls == 0
    assert plan.reason.startswith("torch: NVIDIA GPU found (nvidia-smi -L lists 1 GPU(s))")


def test_no_gpu_and_a_registry_serving_the_cpu_build_installs_exactly_that():
    resolver = RecordingResolver(CPU_RESOLUTION)
    plan = choose_install(NO_GPU, None, resolver)
    assert plan.pip_args == ("install", TORCH_REQUIREMENT)
    assert resolver.calls == 1
    assert "no NVIDIA GPU found (nvidia-smi absent)" in plan.reason
    assert "CPU build" in plan.reason and "configured registry" in plan.reason


def test_no_gpu_and_a_registry_serving_the_cuda_build_uses_the_cpu_index():
    plan = choose_install(NO_GPU, None, RecordingResolver(PYPI_CUDA_RESOLUTION))
    assert plan.pip_args == ("install", TORCH_REQUIREMENT, "--index-url", DEFAULT_CPU_INDEX)
    assert "would install the CUDA build (cuda-toolkit, nvidia-cudnn-cu13, nvidia-nccl-cu13, ...)" in plan.reason
    mirror = "https://mirror.example/torch-cpu"
    assert choose_install(NO_GPU, None, RecordingResolver(PYPI_CUDA_RESOLUTION), mirror).pip_args[-2:] == (
        "--index-url", mirror)


def test_forced_cpu_on_a_gpu_machine_still_honours_a_cpu_serving_registry():
    assert choose_install(A_GPU, "cpu", RecordingResolver(CPU_RESOLUTION)).pip_args == (
        "install", TORCH_REQUIREMENT)
    plan = choose_install(A_GPU, "cpu", RecordingResolver(PYPI_CUDA_RESOLUTION))
    assert plan.pip_args[-2:] == ("--index-url", DEFAULT_CPU_INDEX)
    assert plan.reason.startswith("torch: SPOTLIGHT_TORCH=cpu;")


def test_forced_cuda_without_a_gpu_skips_the_dry_run():
    resolver = RecordingResolver(CPU_RESOLUTION)
    plan = choose_install(NO_GPU, "cuda", resolver)
    assert plan.pip_args == ("install", TORCH_REQUIREMENT)
    assert resolver.calls == 0
    assert plan.reason.startswith("torch: SPOTLIGHT_TORCH=cuda;")


@pytest.mark.parametrize("value", ["gpu", "CPU", "cuda12"])
def test_a_bad_forced_value_is_refused_with_its_name(value):
    with pytest.raises(ValueError, match=f"SPOTLIGHT_TORCH must be 'cpu' or 'cuda'.*{value!r}"):
        choose_install(NO_GPU, value, RecordingResolver(CPU_RESOLUTION))


def test_an_empty_forced_value_means_no_override():
    assert choose_install(A_GPU, "", RecordingResolver(CPU_RESOLUTION)).reason.startswith("torch: NVIDIA GPU found")


def test_cuda_packages_are_named_in_any_spelling():
    assert cuda_packages(CPU_RESOLUTION) == []
    assert cuda_packages([ResolvedPackage("NVIDIA_CUBLAS", "13.1"), ResolvedPackage("Triton", "3.7.1")]) == [
        "nvidia-cublas", "triton"]
    assert cuda_packages([ResolvedPackage("torch", "2.13.0+cu130")]) == ["torch 2.13.0+cu130"]


# The GPU detection.


def _fake_nvidia_smi(folder: Path, body: str) -> str:
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(folder)


def test_a_listing_nvidia_smi_is_a_gpu(tmp_path):
    path = _fake_nvidia_smi(tmp_path / "bin", 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c1f0e6a)"\n')
    assert detect_nvidia_gpu(path, tmp_path / "proc") == GpuFinding(True, "nvidia-smi -L lists 1 GPU(s)")


def test_a_failing_nvidia_smi_is_no_gpu(tmp_path):
    path = _fake_nvidia_smi(
        tmp_path / "bin",
        "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9\n")
    assert detect_nvidia_gpu(path, tmp_path / "proc") == GpuFinding(False, "nvidia-smi -L failed (exit 9)")


def test_no_nvidia_smi_and_no_driver_is_no_gpu(tmp_path):
    (tmp_path / "bin").mkdir()
    assert detect_nvidia_gpu(str(tmp_path / "bin"), tmp_path / "proc") == GpuFinding(False, "nvidia-smi absent")


def test_the_drivers_proc_entries_are_a_gpu_without_nvidia_smi(tmp_path):
    (tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:00:1e.0").mkdir(parents=True)
    (tmp_path / "bin").mkdir()
    finding = detect_nvidia_gpu(str(tmp_path / "bin"), tmp_path / "proc")
    assert finding.present and "lists 1 GPU(s)" in finding.evidence


# pip's report.


def test_a_pip_report_lists_its_packages(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({
        "version": "1",
        "pip_version": "26.3",
        "install": [
            {"download_info": {"url": "https://files.pythonhosted.org/packages/01/79/torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                               "archive_info": {"hashes": {"sha256": "60fcdcb2"}}},
             "is_direct": False, "is_yanked": False, "requested": True,
             "metadata": {"metadata_version": "2.4", "name": "torch", "version": "2.13.0", "requires_python": ">=3.10"}},
            {"download_info": {"url": "https://files.pythonhosted.org/packages/aa/bb/triton-3.7.1-cp311-cp311-manylinux_2_28_x86_64.whl"},
             "is_direct": False, "is_yanked": False, "requested": False,
             "metadata": {"metadata_version": "2.1", "name": "triton", "version": "3.7.1"}},
        ],
        "environment": {"platform_machine": "x86_64", "sys_platform": "linux"},
    }))
    assert parse_pip_report(report.read_text()) == [ResolvedPackage("torch", "2.13.0"), ResolvedPackage("triton", "3.7.1")]


def test_a_report_without_packages_is_refused():
    with pytest.raises(ValueError, match="not a pip installation report"):
        parse_pip_report(json.dumps({"version": "1", "packages": []}))


LOCAL_TORCH_WHEELS = sorted(Path("/opt/wheels").glob(f"torch-{install_torch.TORCH_VERSION}+cpu-*.whl"))


@pytest.mark.skipif(not (LOCAL_TORCH_WHEELS and Path("/opt/pypi/simple").is_dir()),
                    reason="needs this CI machine's local CPU torch wheel and package mirror")
def test_real_pip_resolves_the_local_cpu_wheel_to_no_cuda_package():
    """The dry run and report parsing against pip itself (about 1 s): `--isolated` drops the
    user's configuration, so only the local `file://` sources below are read."""
    resolution = install_torch.resolve_with_pip(
        sys.executable, TORCH_REQUIREMENT,
        ["--isolated", "--index-url", "file:///opt/pypi/simple", "--find-links", "/opt/wheels"])
    assert ResolvedPackage("torch", f"{install_torch.TORCH_VERSION}+cpu") in resolution
    assert cuda_packages(resolution) == []
    assert choose_install(NO_GPU, None, lambda: resolution).pip_args == ("install", TORCH_REQUIREMENT)


# The script `make` runs.


def test_the_module_imports_the_standard_library_only():
    """`make` runs it before anything else is installed, as a file (not `-m spotlight...`)."""
    tree = ast.parse(SCRIPT.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported - set(sys.stdlib_module_names)


def test_the_script_explains_a_forced_cuda_install_without_installing(tmp_path):
    """Run as `make` runs it on a fresh virtualenv: a `torch` that fails to import shadows the
    installed one (and saves the seconds a real import takes); `cuda` forced, so no registry is
    asked; --dry-run installs nothing."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('not installed yet')\n")
    env = {**os.environ, "SPOTLIGHT_TORCH": "cuda", "PATH": str(tmp_path), "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"torch: SPOTLIGHT_TORCH=cuda; installing {TORCH_REQUIREMENT} from your pip's configured registry "
        "(on Linux its default build is the CUDA one)",
        f"would run: {sys.executable} -m pip install {TORCH_REQUIREMENT}",
    ]


def test_the_script_refuses_a_bad_override_in_one_line():
    env = {**os.environ, "SPOTLIGHT_TORCH": "gpu"}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == "error: SPOTLIGHT_TORCH must be 'cpu' or 'cuda' (or unset), not 'gpu'\n"


# The files that must agree with it.


def test_the_makefile_installs_torch_through_the_module_only():
    makefile = (ROOT / "Makefile").read_text()
    assert "\t$(PY) spotlight/install_torch.py\n" in makefile
    assert "torch==" not in makefile


def test_the_lock_and_the_readme_name_the_modules_torch():
    lock_pins = [line for line in (ROOT / "cloud" / "fleet.lock").read_text().splitlines()
                 if line.startswith("torch==")]
    assert lock_pins == [TORCH_REQUIREMENT]
    install_section = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    assert f"`{TORCH_REQUIREMENT}`" in install_section
