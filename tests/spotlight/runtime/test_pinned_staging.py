"""The CUDA learner's publication through page-locked buffers allocated once (issue 39, item 3):
what leaves is the weights as they were, and does not change with later steps. Needs a CUDA GPU
(page-locked memory is CUDA's); skipped elsewhere — the CPU learner copies as before."""

import pytest
import torch

from spotlight.runtime.learner import PinnedStaging

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (page-locked buffers)")]


def test_weights_leave_through_buffers_made_once_and_the_copies_do_not_change_after():
    state = {"a": torch.randn(64, 32, device="cuda", dtype=torch.bfloat16), "b": torch.randn(7, device="cuda")}
    staging = PinnedStaging()
    first = staging.copy(state)
    buffers = {k: b.data_ptr() for k, b in staging.buffers.items()}
    assert all(staging.buffers[k].is_pinned() for k in state)
    assert all(torch.equal(first[k], state[k].cpu()) and first[k].device.type == "cpu" for k in state)
    for v in state.values():
        v.add_(1)  # the next update
    second = staging.copy(state)
    assert {k: b.data_ptr() for k, b in staging.buffers.items()} == buffers  # allocated once
    assert all(torch.equal(second[k], state[k].cpu()) for k in state)
    assert all(torch.equal(first[k] + 1, second[k]) for k in state)  # the first copy kept its values
    staging.copy({"a": torch.zeros(3, device="cuda")})  # a tensor of another shape gets a buffer of its own
    assert staging.buffers["a"].shape == (3,)
