"""What an attacker with write access to a bucket or a port would plant: a pickle that runs a shell
command when it is unpickled (by pickle.load, or torch.load(weights_only=False)). The command only
touches a marker file, so a test sees whether it ran."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import torch


class Payload:
    def __init__(self, marker: Path | str) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def pickled(obj: object) -> bytes:
    return pickle.dumps(obj)


def torch_saved(obj: object) -> bytes:
    """`obj` as `torch.save` writes it (a zip holding a pickle)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()
