"""The torch install: which build of `torch==TORCH_VERSION` this machine gets, and installing it.

`make` runs this file with the virtualenv's Python *before* this package or any dependency is
installed (`$(PY) spotlight/install_torch.py`, tests/spotlight/test_install_torch.py checks the Makefile
says so), so it imports the standard library only, never `spotlight`
(`test_the_module_imports_the_standard_library_only`). It exists because a bare `pip install
torch` on Linux x86_64 is PyPI's CUDA build, which pulls several GB of `nvidia-*`/`cuda-*` wheels
and `triton` even on a machine without a GPU.

The choice, made by `choose_install` from what `detect_nvidia_gpu` and `resolve_with_pip` found:

- torch already imports in this Python: nothing is installed.
- `SPOTLIGHT_TORCH=cpu|cuda` forces the build; any other non-empty value is an error (exit 2).
- An NVIDIA GPU (`nvidia-smi -L` lists one, or `/proc/driver/nvidia/gpus` has an entry), or
  `cuda` forced: `pip install torch==TORCH_VERSION` through the user's configured registry (PyPI's
  Linux wheel is the CUDA build).
- No GPU, or `cpu` forced: pip is asked what that same install would resolve to (`--dry-run
  --report`). If the resolution has no CUDA package (this CI machine's local CPU wheel, macOS,
  Windows), exactly that is installed; otherwise the CPU build comes from PyTorch's CPU index
  (`SPOTLIGHT_TORCH_CPU_INDEX` names a mirror of it).

One line says what was chosen and why, and the pip command is printed before it runs.
`--dry-run` prints both and installs nothing, whether or not torch is already present.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

TORCH_VERSION = "2.13.0"
"""The torch every environment gets: cloud/fleet.lock pins the same (a test checks they agree)."""
TORCH_REQUIREMENT = f"torch=={TORCH_VERSION}"
DEFAULT_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
"""PyTorch's index of CPU-only builds; `SPOTLIGHT_TORCH_CPU_INDEX` replaces it (a mirror)."""
FORCE_VARIABLE = "SPOTLIGHT_TORCH"
CPU_INDEX_VARIABLE = "SPOTLIGHT_TORCH_CPU_INDEX"
FORCED_BUILDS = ("cpu", "cuda")

# A wedged driver can leave `nvidia-smi` hanging for minutes; past this it counts as no GPU.
NVIDIA_SMI_TIMEOUT_S = 30


@dataclass(frozen=True)
class GpuFinding:
    """Whether an NVIDIA GPU was found, and the evidence, worded for the line the user reads."""

    present: bool
    evidence: str


@dataclass(frozen=True)
class ResolvedPackage:
    """One entry of the `install` list of a pip `--report`: a distribution pip would install."""

    name: str
    version: str

    @property
    def normalized_name(self) -> str:
        """The PEP 503 form (`Nvidia_CUBLAS` -> `nvidia-cublas`), so prefixes compare reliably."""
        return re.sub(r"[-_.]+", "-", self.name).lower()


@dataclass(frozen=True)
class InstallPlan:
    """The arguments after `python -m pip`, and the line that tells the user why."""

    pip_args: tuple[str, ...]
    reason: str


def detect_nvidia_gpu(search_path: str | None, proc_root: Path = Path("/proc")) -> GpuFinding:
    """Look for an NVIDIA GPU: `nvidia-smi -L` on `search_path` (a PATH string) listing a line
    that starts with "GPU", or an entry under `proc_root`/driver/nvidia/gpus (the kernel driver's
    view, there even when `nvidia-smi` is not installed, e.g. in a container)."""
    gpus_folder = proc_root / "driver" / "nvidia" / "gpus"
    if gpus_folder.is_dir():
        entries = sorted(entry.name for entry in gpus_folder.iterdir())
        if entries:
            return GpuFinding(True, f"{gpus_folder} lists {len(entries)} GPU(s)")
    nvidia_smi = shutil.which("nvidia-smi", path=search_path)
    if nvidia_smi is None:
        return GpuFinding(False, "nvidia-smi absent")
    try:
        listing = subprocess.run(
            [nvidia_smi, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return GpuFinding(False, f"nvidia-smi -L did not run ({error})")
    if listing.returncode != 0:
        return GpuFinding(False, f"nvidia-smi -L failed (exit {listing.returncode})")
    gpus = [line for line in listing.stdout.splitlines() if line.strip().startswith("GPU")]
    if not gpus:
        return GpuFinding(False, "nvidia-smi -L lists no GPU")
    return GpuFinding(True, f"nvidia-smi -L lists {len(gpus)} GPU(s)")


def parse_pip_report(report_text: str) -> list[ResolvedPackage]:
    """The packages of a pip installation report (`pip install --report`, format version "1":
    `{"version": "1", "install": [{"metadata": {"name": ..., "version": ...}, ...}, ...]}`)."""
    report = json.loads(report_text)
    try:
        return [
            ResolvedPackage(entry["metadata"]["name"], entry["metadata"]["version"])
            for entry in report["install"]
        ]
    except (KeyError, TypeError) as error:
        raise ValueError(
            f"not a pip installation report: no install[].metadata.name/version ({error!r})"
        ) from error


def cuda_packages(resolution: Sequence[ResolvedPackage]) -> list[str]:
    """The names in `resolution` that only a CUDA build of torch pulls. PyPI's Linux x86_64 torch
    2.13.0 resolved (2026-11, pip 26.3) to 13 `nvidia-*` wheels (cuBLAS, cuDNN, NCCL, ...),
    `cuda-toolkit`, `cuda-bindings`, `cuda-pathfinder` and `triton`; the CPU build to none of
    them. A torch labelled `+cu...` (a CUDA index in the user's configuration) counts too."""
    names = []
    for package in resolution:
        name = package.normalized_name
        if name.startswith(("nvidia-", "cuda-")) or name == "triton":
            names.append(name)
        elif name == "torch" and "+cu" in package.version:
            names.append(f"torch {package.version}")
    return names


def parse_forced(value: str | None) -> str | None:
    """`SPOTLIGHT_TORCH`'s value as a build ("cpu" or "cuda"), None when unset or empty (so
    `SPOTLIGHT_TORCH= make` means no override); any other value is a ValueError naming it."""
    value = (value or "").strip()
    if value and value not in FORCED_BUILDS:
        raise ValueError(f"{FORCE_VARIABLE} must be 'cpu' or 'cuda' (or unset), not {value!r}")
    return value or None


def choose_install(
    gpu: GpuFinding,
    forced: str | None,
    resolve_configured: Callable[[], Sequence[ResolvedPackage]],
    cpu_index: str = DEFAULT_CPU_INDEX,
) -> InstallPlan:
    """The pip arguments that install the right build of `TORCH_REQUIREMENT`.

    `forced` is `SPOTLIGHT_TORCH` as `parse_forced` reads it (a bad value is its ValueError).
    `resolve_configured` returns what `pip install TORCH_REQUIREMENT` would install through the
    user's configured registry; it is called only when a CPU build is wanted, so a GPU machine
    never pays for the dry run."""
    forced = parse_forced(forced)
    # Not --quiet: pip's own bars (downloading, then installing N/M packages) are the only sign
    # of life in a minute of unpacking torch (measured: 21 s silent with --quiet).
    configured = ("install", TORCH_REQUIREMENT)
    if forced == "cuda":
        why, wants_cuda = f"{FORCE_VARIABLE}=cuda", True
    elif forced == "cpu":
        why, wants_cuda = f"{FORCE_VARIABLE}=cpu", False
    elif gpu.present:
        why, wants_cuda = f"NVIDIA GPU found ({gpu.evidence})", True
    else:
        why, wants_cuda = f"no NVIDIA GPU found ({gpu.evidence})", False
    if wants_cuda:
        return InstallPlan(
            configured,
            f"torch: {why}; installing {TORCH_REQUIREMENT} from your pip's configured registry "
            "(on Linux its default build is the CUDA one)",
        )
    pulled_cuda = cuda_packages(resolve_configured())
    if not pulled_cuda:
        return InstallPlan(
            configured,
            f"torch: {why}; installing the CPU build {TORCH_REQUIREMENT} from your pip's "
            "configured registry (it resolves to no CUDA package)",
        )
    shown = ", ".join(pulled_cuda[:3]) + (", ..." if len(pulled_cuda) > 3 else "")
    return InstallPlan(
        (*configured, "--index-url", cpu_index),
        f"torch: {why}; your pip's configured registry would install the CUDA build ({shown}), "
        f"so installing the CPU build {TORCH_REQUIREMENT} from {cpu_index}",
    )


def resolve_with_pip(
    python: str, requirement: str, extra_pip_args: Sequence[str] = ()
) -> list[ResolvedPackage]:
    """What `python -m pip install requirement` would install, asked without installing.
    `--ignore-installed` makes the answer name every package the requirement pulls, whatever this
    environment already holds (a leftover `nvidia-*` would otherwise hide a CUDA resolution)."""
    with tempfile.TemporaryDirectory(prefix="spotlight-torch-") as folder:
        report = Path(folder) / "report.json"
        command = [python, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                   "--report", str(report), *extra_pip_args, requirement]
        completed = subprocess.run(command, capture_output=True, text=True)
        if completed.returncode != 0:
            raise RuntimeError(
                f"pip could not resolve {requirement} (exit {completed.returncode}): "
                f"{' '.join(command)}\n{completed.stderr.strip()}"
            )
        return parse_pip_report(report.read_text())


def installed_torch_version(python: str) -> str | None:
    """torch's version if it imports in `python` (a separate process: importing it here would cost
    a second and hundreds of MB for a yes/no), else None."""
    completed = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    )
    return completed.stdout.strip() if completed.returncode == 0 else None


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """Install the chosen build into this Python (the Makefile's venv); 2 on a bad override."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="print the choice and the pip command, install nothing")
    args = parser.parse_args(argv)
    try:
        forced = parse_forced(environ.get(FORCE_VARIABLE))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    python = sys.executable
    present = installed_torch_version(python)
    if present is not None and not args.dry_run:
        print(f"torch: {present} already imports; nothing to install")
        return 0
    if present is not None:
        print(f"torch: {present} already imports; were it absent:")
    try:
        plan = choose_install(
            detect_nvidia_gpu(environ.get("PATH")),
            forced,
            lambda: resolve_with_pip(python, TORCH_REQUIREMENT),
            environ.get(CPU_INDEX_VARIABLE, "").strip() or DEFAULT_CPU_INDEX,
        )
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    command = [python, "-m", "pip", *plan.pip_args]
    print(plan.reason)
    print(("would run: " if args.dry_run else "+ ") + " ".join(command), flush=True)
    if args.dry_run:
        return 0
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
