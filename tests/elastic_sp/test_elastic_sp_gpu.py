"""Ulysses SP on NCCL: the same equality as on gloo, on two or more GPUs (skipped without)."""

from __future__ import annotations

import copy
import threading
from datetime import timedelta

import pytest
import torch

import elastic_sp
from elastic_sp.group import Rendezvous, SPGroup
from spotlight.config import default_config
from spotlight.rl.dit_model import velocity
from spotlight.rl.sp_member import serve_spec, tiny_arch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                       reason="needs 2 CUDA GPUs (one NCCL rank per GPU)"),
]


def test_sp_output_on_nccl_equals_single_process():
    import torch.distributed as dist

    degree = 2
    model = serve_spec(default_config(), arch=tiny_arch(4)).build_model()
    g = torch.Generator().manual_seed(3)
    x, emb = torch.randn(1, 25, 16, generator=g), torch.randn(1, 8, 32, generator=g)
    sigma, mask = torch.tensor([0.5]), torch.ones(1, 8, dtype=torch.long)
    with torch.no_grad():
        ref = velocity(model, x, sigma, emb, mask, 10)
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    outs: list = [None] * degree

    def body(rank: int) -> None:
        device = torch.device(f"cuda:{rank}")
        torch.cuda.set_device(device)
        group = SPGroup.form(Rendezvous("127.0.0.1", store.port, 1, 60), rank, degree, device)
        m = copy.deepcopy(model).to(device)
        elastic_sp.apply(m, group)
        with torch.no_grad():
            outs[rank] = velocity(m, x.to(device), sigma.to(device), emb.to(device), mask.to(device), 10).cpu()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(degree)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)  # TF32 / other GPU kernels
