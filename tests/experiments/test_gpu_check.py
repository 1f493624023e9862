"""The GPU check (issue 39) without a GPU: its tiny CPU version trains, resumes and prints every
phase (the rollout split into encode, denoising and decode); the memory line against the estimate
with assumed and measured constants; the folder builder keeps a finished build, redoes one cut short and never removes a folder
it did not make; random weights written shard by shard load through `from_pretrained`."""

from __future__ import annotations

import json

import pytest
import torch

from experiments import build_check_pipeline, gpu_check
from experiments.random_shards import _tensor, write_random_weights


def test_the_tiny_check_trains_resumes_and_times_every_phase(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "run"), "--folder", str(tmp_path / "check")]) == 0
    out = capsys.readouterr().out
    if not torch.cuda.is_available():
        assert out.startswith("gpu-check: no CUDA GPU here: running the tiny CPU version only\n")
    result = json.loads((tmp_path / "run" / "gpu-check.json").read_text())
    assert result["iterations"] == 3 and result["resumed_from"] == 2  # the last iteration resumed
    assert list(result["phases"]) == list(gpu_check.PHASES)
    for phase, seconds in result["phases"].items():
        assert seconds["first_s"] > 0 and seconds["later_s"] > 0 and seconds["per_sample_s"] > 0, phase
    assert result["samples_per_iteration"] == 8 and result["samples_per_pass"] == {"rollout": 4, "update": 4}
    assert result["memory"] == {"estimate_host_bytes": result["memory"]["estimate_host_bytes"]} or torch.cuda.is_available()
    table = out[out.index("gpu-check (tiny Qwen-Image"):]
    assert all(f"\n{phase} " in table for phase in gpu_check.PHASES), table
    assert f"the run: {tmp_path / 'run'} (resumed from iteration 2" in table


def test_the_memory_line_sets_the_measured_peak_against_the_estimate_with_either_constants():
    """What a CUDA run's summary gives (no GPU here: its fields as a run on one writes them): the
    measured peak is the reserved peak plus what the process held outside the allocator; the
    measured constants are that outside memory and reserved / allocated - 1; the estimate is
    judged against the 15% bar with them."""
    from types import SimpleNamespace

    from spotlight.device_constants import ASSUMED, DeviceConstants

    gib = 1 << 30
    est = SimpleNamespace(host=2 * gib, device_tensors=50 * gib)
    summary = {"device_peak_bytes": 55 * gib, "device_peak_allocated_bytes": 50 * gib, "device_outside_bytes": gib}
    m = gpu_check.memory(summary, est, "NVIDIA H200")
    assert m["measured_bytes"] == 56 * gib
    constants = DeviceConstants(**m["constants"])
    assert constants.cuda_context == gib and abs(constants.allocator_slack - 0.1) < 1e-12
    assert constants.measured_on.startswith("NVIDIA H200, 20") and constants.measured_on.endswith("(make gpu-check)")
    assert m["estimate_measured_bytes"] == 56 * gib and m["within_met"] and abs(m["error_measured"]) < 1e-9
    assert m["estimate_assumed_bytes"] == 50 * gib + ASSUMED.cuda_context and m["error_assumed"] < -0.09
    far = gpu_check.memory(summary, SimpleNamespace(host=0, device_tensors=40 * gib), "NVIDIA H200")
    assert not far["within_met"] and -0.2 < far["error_measured"] < -0.19  # (40 x 1.1 + 1) / 56 - 1
    line = gpu_check.show({"size": "real", "device": "cuda", "iterations": 3, "samples_per_iteration": 8,
                           "samples_per_pass": {"rollout": 4, "update": 4}, "iteration_s": 1.0, "phases": {}, "memory": far,
                           "run_folder": "r", "resumed_from": 2}).splitlines()[2]
    assert line.startswith("peak GPU memory 56.0 GiB (tensors 50.0, allocator slack 10%, outside the allocator "
                           "1.00); estimated 40.5 GiB with the assumed constants (-28%), 45.0 GiB with these "
                           "(-20%: NOT within 15%)"), line
    assert gpu_check.memory({"device_peak_bytes": None}, est, None) == {"estimate_host_bytes": 2 * gib}


def test_the_builder_keeps_a_finished_build_redoes_a_cut_short_one_and_removes_nothing_else(tmp_path):
    lines: list[str] = []
    folder = build_check_pipeline.build(tmp_path / "llm", "tiny", "llm", say=lines.append)
    assert build_check_pipeline.built(folder, "tiny", "llm")
    stamp = (folder / "config.json").stat().st_mtime_ns
    build_check_pipeline.build(folder, "tiny", "llm", say=lines.append)
    assert lines[-1].endswith("already built (tiny llm)") and (folder / "config.json").stat().st_mtime_ns == stamp
    mark = json.loads((folder / build_check_pipeline.MARK).read_text())
    (folder / build_check_pipeline.MARK).write_text(json.dumps({**mark, "finished": False}))  # a build killed
    build_check_pipeline.build(folder, "tiny", "llm", say=lines.append)
    assert build_check_pipeline.built(folder, "tiny", "llm")
    # A user's own model folder (no mark of ours), or another build: refused, left as it was.
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "model_index.json").write_text("{}")
    for target, size in ((theirs, "tiny"), (folder, "real")):
        before = sorted(p.name for p in target.iterdir())
        with pytest.raises(ValueError, match="is not a check build of this size and kind .*nothing was removed"):
            build_check_pipeline.build(target, size, "llm")
        assert sorted(p.name for p in target.iterdir()) == before
    assert build_check_pipeline.main(["--size", "tiny", "--kind", "llm", "--out", str(theirs)]) == 2


def test_random_weights_written_shard_by_shard_load_through_from_pretrained(tmp_path):
    """The real-size folder's writer, at a size a test can load: several shards and their index, as
    diffusers' `save_pretrained` writes them; values as the module says (scaled normal, norms 1,
    biases 0), the same from the same seed."""
    from diffusers import QwenImageTransformer2DModel

    from spotlight.dit_presets import TINY_TRANSFORMER

    with torch.device("meta"):
        model = QwenImageTransformer2DModel(**TINY_TRANSFORMER)
    model.save_config(str(tmp_path / "t"))
    files = write_random_weights(model, tmp_path / "t", "diffusion_pytorch_model", seed=3, max_shard_bytes=20_000,
                                 device="cpu")
    assert len(files) > 3 and (tmp_path / "t" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    loaded = QwenImageTransformer2DModel.from_pretrained(str(tmp_path / "t"), torch_dtype=torch.bfloat16)
    state = loaded.state_dict()
    assert set(state) == set(model.state_dict())
    for name, value in state.items():
        assert torch.equal(value, _tensor(name, value.shape, torch.bfloat16, 3)), name
    weight = next(v for n, v in state.items() if v.dim() == 2)
    assert 0.5 < weight.float().std().item() * weight.shape[1] ** 0.5 < 1.5  # std ~ fan_in ** -0.5
    assert any(n.endswith("bias") for n in state) and all(not v.any() for n, v in state.items() if n.endswith("bias"))
