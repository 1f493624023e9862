"""The GPU check (issue 39) without a GPU: its tiny CPU version trains, resumes and prints every
phase; the folder builder keeps a finished build, redoes one cut short and never removes a folder
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
    assert result["samples_per_iteration"] == 8 and result["samples_per_pass"] == 4
    table = out[out.index("gpu-check (tiny Qwen-Image"):]
    assert all(f"\n{phase} " in table for phase in gpu_check.PHASES), table
    assert f"the run: {tmp_path / 'run'} (resumed from iteration 2" in table


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
