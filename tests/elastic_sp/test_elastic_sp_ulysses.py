"""Ulysses SP on real gloo process groups: the group's output equals the single-process output.

The ranks of a group run as threads of this process, each with its own copy of the model and its
own `ProcessGroupGloo` on 127.0.0.1 (gloo does not care whether its peers are threads or
processes, and threads spare each test the interpreter start-ups). Member processes are covered
by test_elastic_sp_agent.py.
"""

from __future__ import annotations

import copy
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import elastic_sp
from elastic_sp.group import GroupBroken, Rendezvous, SPGroup
from spotlight.config import default_config
from spotlight.rl.dit_model import velocity
from spotlight.rl.sp_member import serve_spec, tiny_arch


def run_group(degree: int, fn, timeout_s: float = 60.0) -> list:
    """Run fn(rank, group) on `degree` threads forming one real gloo group; results by rank."""
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    out: list = [None] * degree
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            group = SPGroup.form(Rendezvous("127.0.0.1", store.port, generation=1, timeout_s=30), rank, degree)
            out[rank] = fn(rank, group)
        except BaseException as err:  # surfaced below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(degree)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    assert not any(t.is_alive() for t in threads), "an SP rank hung"
    if errors:
        raise errors[0]
    return out


def inputs(side: int, batch: int = 2, text: int = 8):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(batch, (side // 2) ** 2, 16, generator=g)
    emb = torch.randn(batch, text, 32, generator=g)
    mask = torch.ones(batch, text, dtype=torch.long)
    mask[0, 5:] = 0  # a padded prompt: its text keys must stay masked under SP too
    sigma = torch.tensor([0.3, 0.8])[:batch]
    return x, sigma, emb, mask, side


@pytest.fixture(scope="module")
def model4():
    return serve_spec(default_config(), arch=tiny_arch(4)).build_model()


@pytest.mark.parametrize("side", [16, 10], ids=["64-tokens", "25-tokens-padded"])
@pytest.mark.parametrize("degree", [1, 2, 4])
def test_sp_output_equals_single_process(model4, degree, side):
    args = inputs(side)
    with torch.no_grad():
        ref = velocity(model4, *args)

    def fn(rank, group):
        m = copy.deepcopy(model4)
        elastic_sp.apply(m, group)
        with torch.no_grad():
            return velocity(m, *args)

    outs = run_group(degree, fn)
    for out in outs:
        assert out.shape == ref.shape
        # 64 tokens split evenly: the same kernels on the same rows, bit for bit. 25 tokens padded
        # to 26 or 28: attention runs with a key mask (another SDPA path), ~1e-7 apart.
        if (side // 2) ** 2 % degree == 0:
            assert torch.equal(out, ref)
        else:
            torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
    assert all(torch.equal(o, outs[0]) for o in outs)  # every rank holds the same gathered output


def test_sp_without_text_mask_and_batch_one(model4):
    x, sigma, emb, _, side = inputs(10, batch=1)
    with torch.no_grad():
        ref = velocity(model4, x, sigma, emb, None, side)

    def fn(rank, group):
        m = copy.deepcopy(model4)
        elastic_sp.apply(m, group)
        with torch.no_grad():
            return velocity(m, x, sigma, emb, None, side)

    for out in run_group(4, fn):
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_zero_cond_t_model_shards_its_modulation_index():
    spec = serve_spec(default_config(), arch=dict(tiny_arch(2), zero_cond_t=True))
    model = spec.build_model()
    args = inputs(10)
    with torch.no_grad():
        ref = velocity(model, *args)

    def fn(rank, group):
        m = copy.deepcopy(model)
        elastic_sp.apply(m, group)
        with torch.no_grad():
            return velocity(m, *args)

    for out in run_group(2, fn):
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_regroup_swaps_the_group_in_place_and_remove_restores_the_model(model4):
    m = copy.deepcopy(model4)
    sp = elastic_sp.apply(m, None)
    assert elastic_sp.apply(m, SPGroup.local()) is sp  # a regroup re-points the same hooks
    processors = {type(p).__name__ for p in m.attn_processors.values()}
    assert processors == {"UlyssesAttnProcessor"}
    elastic_sp.remove(m)
    assert {type(p).__name__ for p in m.attn_processors.values()} == {"QwenDoubleStreamAttnProcessor2_0"}
    args = inputs(16)
    with torch.no_grad():
        assert torch.equal(velocity(m, *args), velocity(model4, *args))


def test_impossible_degree_is_a_clear_error(model4):
    def fn(rank, group):
        with pytest.raises(ValueError, match=r"SP degree 3 does not divide the model's 4 attention heads"):
            elastic_sp.apply(copy.deepcopy(model4), group)
        return True

    assert run_group(3, fn) == [True] * 3


def test_not_a_qwen_image_model_is_rejected():
    with pytest.raises(TypeError, match="QwenImageTransformer2DModel"):
        elastic_sp.apply(torch.nn.Linear(2, 2), None)


def test_a_collective_ends_with_group_broken_when_a_command_arrives():
    """A rank waiting on a peer that never joins the collective is freed by its inbox."""

    class Inbox:
        def __init__(self):
            self.wake = threading.Event()
            self.commands: list = []

        def pending(self):
            return bool(self.commands)

    inbox = Inbox()
    done = threading.Event()

    def fn(rank, group):
        if rank == 1:  # stays in the group (its sockets open) but never enters the all-to-all
            done.wait(30)
            return None
        group.interrupt = inbox
        threading.Timer(0.2, lambda: (inbox.commands.append("re-form"), inbox.wake.set())).start()
        try:
            with pytest.raises(GroupBroken, match="re-formed by the agent"):
                group.all_to_all(torch.zeros(2, 3))
        finally:
            done.set()
        group.abandon()
        return True

    assert run_group(2, fn)[0] is True
