"""The memory estimate's GPU constants, and which of them were measured: the CUDA context's bytes
and the caching allocator's slack. `make gpu-check` measures both on the GPU it runs on and writes
them to `gpu_measured.json` beside this module (experiments/gpu_check.py, `record`); without that
file both are assumptions, and say so (`DeviceConstants.describe`). Torch-free: the memory check
reads them before anything is built."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

MEASURED = Path(__file__).with_name("gpu_measured.json")
"""What `make gpu-check` measured (absent until a check ran on a GPU and its file was committed)."""
MIB = 1 << 20

ASSUMED_CONTEXT = 512 * MIB
"""Device memory a CUDA context and torch's kernels take before any tensor (assumed: 300-500 MB on
recent GPUs with CUDA 12, PyTorch's CUDA semantics notes; rounded up)."""
ASSUMED_SLACK = 0.0
"""What the caching allocator reserves beyond the tensors it holds at the peak, as a fraction of
them (assumed none: the GPU activation constants, `memory_estimate.DIT_ON_GPU`, count the tensors
as a caching allocator reuses freed blocks; fragmentation is what a measurement adds)."""


@dataclass(frozen=True)
class DeviceConstants:
    cuda_context: int
    """Bytes of a CUDA context with torch's kernels loaded."""
    allocator_slack: float
    """torch.cuda.max_memory_reserved / max_memory_allocated - 1 of a run."""
    measured_on: str | None = None
    """The GPU and date of the measurement (`make gpu-check`); None: assumed."""

    def device_bytes(self, tensors: int) -> int:
        """The GPU memory a process needs whose tensors take `tensors` bytes at their peak."""
        return int(tensors * (1 + self.allocator_slack)) + self.cuda_context

    def describe(self) -> str:
        """One line for a user: which constants are measured, and where."""
        values = f"CUDA context {self.cuda_context / MIB:,.0f} MiB, allocator slack {self.allocator_slack:.0%}"
        if self.measured_on:
            return f"GPU constants measured on {self.measured_on}: {values}"
        return f"GPU constants assumed (no `make gpu-check` measured them yet): {values}"


ASSUMED = DeviceConstants(ASSUMED_CONTEXT, ASSUMED_SLACK)


def device_constants(path: Path | None = None) -> DeviceConstants:
    """The measured constants when `path` (default `MEASURED`) holds them (a damaged or partial file
    counts as none: the estimate falls back to the assumptions rather than fail a run), else `ASSUMED`."""
    path = MEASURED if path is None else path
    try:
        data = json.loads(path.read_text())
        context, slack, on = data["cuda_context"], data["allocator_slack"], data["measured_on"]
    except (OSError, ValueError, KeyError, TypeError):
        return ASSUMED
    if not (isinstance(context, int) and 0 < context < 1 << 40 and isinstance(slack, (int, float))
            and 0 <= slack < 4 and isinstance(on, str)):
        return ASSUMED
    return DeviceConstants(context, float(slack), on[:200])


def record(constants: DeviceConstants, path: Path | None = None) -> Path:
    """Write measured `constants` where `device_constants` reads them (default `MEASURED`)."""
    path = MEASURED if path is None else path
    path.write_text(json.dumps(asdict(constants), indent=2) + "\n")
    return path
