"""experiments/measure_step_times.py: the smoke run on CPU (tiny preset) writes step-time files the
simulator reads; on a CUDA machine the GPU test runs the real preset's path (bfloat16, built on the
device) at a small size, and is skipped without one."""

import json
from pathlib import Path

import pytest
import torch

from experiments.measure_step_times import build, main, simulator_gpu
from spotlight.sim.step_time import StepTimes


def test_the_cpu_smoke_run_writes_step_time_files_the_simulator_reads(tmp_path, capsys):
    main(["--out", str(tmp_path), "--preset", "tiny", "--device", "cpu", "--resolutions", "16", "32",
          "--steps", "3", "--warmup", "1"])
    measured = json.loads((tmp_path / "measured.json").read_text())
    assert [r["resolution"] for r in measured["rows"]] == [16, 32] and measured["dtype"] == "torch.float32"
    assert measured["lora_rank"] == 64 and measured["lora_params"] > 0
    for row in measured["rows"]:
        steps = StepTimes.load(tmp_path / f"cpu-{row['resolution']}.yaml")
        assert steps.gpu == "cpu" and steps.denoise_step_s == row["plain_s"] > 0
        assert steps.cfg_factor == pytest.approx(row["guided_s"] / row["plain_s"])  # measured: no range asserted
        # the LoRA update's row (forward + backward into the adapters), as the simulator's factor
        assert row["lora_train_s"] > 0 and row["lora_train_guided_s"] > 0
        assert steps.train_flops_factor == pytest.approx(row["lora_train_s"] / row["plain_s"])
    assert measured["rows"][1]["image_tokens"] == 4 * measured["rows"][0]["image_tokens"]
    assert "LoRA update row" in capsys.readouterr().out


def test_batches_the_full_row_and_the_learner_are_recorded(tmp_path):
    main(["--out", str(tmp_path), "--preset", "tiny", "--device", "cpu", "--resolutions", "16", "--steps", "1",
          "--warmup", "0", "--batch", "2", "--full-row", "--lora-rank", "4"])
    measured = json.loads((tmp_path / "measured.json").read_text())
    row = measured["rows"][0]
    assert measured["batch"] == 2 and row["full_train_s"] > 0 and row["full_train_guided_s"] > 0
    assert row["full_train_extra_gib"] is None  # no CUDA here
    assert set(measured["learner"]) == {"part_sum_s", "optimizer_step_s", "publish_to_host_s", "publish_to_pinned_s",
                                        "publication_bytes"}
    assert measured["learner"]["publication_bytes"] == measured["lora_params"] * 4  # float32 adapters


def test_a_device_name_maps_to_the_simulators_gpu():
    assert simulator_gpu("NVIDIA H100 80GB HBM3") == "H100"
    assert simulator_gpu("NVIDIA A100-SXM4-80GB") == "A100-80GB" and simulator_gpu("NVIDIA A100-SXM4-40GB") == "A100"
    assert simulator_gpu("Some Future GPU") == "Some Future GPU"


def test_the_shipped_h100_files_load_as_the_h100_and_the_default_model_passes_through_them():
    from spotlight.sim.step_time import H100_STEP_TIME, image_tokens

    for resolution in (512, 1280):
        steps = StepTimes.load(Path("experiments/step_times") / f"h100-{resolution}.yaml")
        assert steps.gpu == "H100" and steps.train_flops_factor > 3
        assert H100_STEP_TIME(image_tokens(resolution), 1) == pytest.approx(steps.denoise_step_s, rel=1e-5)
        assert StepTimes().denoise_s(resolution, 1) == pytest.approx(2 * steps.denoise_step_s, rel=1e-5)  # CFG 2


def test_lora_rank_0_skips_the_update_rows(tmp_path):
    main(["--out", str(tmp_path), "--preset", "tiny", "--device", "cpu", "--resolutions", "16", "--steps", "1",
          "--lora-rank", "0"])
    measured = json.loads((tmp_path / "measured.json").read_text())
    assert measured["lora_params"] == 0 and "lora_train_s" not in measured["rows"][0]
    assert StepTimes.load(tmp_path / "cpu-16.yaml").train_flops_factor == StepTimes().train_flops_factor


def test_a_resolution_the_latents_cannot_patch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not divisible by 2"):
        main(["--out", str(tmp_path), "--preset", "tiny", "--device", "cpu", "--resolutions", "15", "--steps", "1"])


def test_building_leaves_the_default_dtype_as_it_was():
    model = build("tiny", "cpu")
    assert next(model.parameters()).dtype == torch.float32 and torch.get_default_dtype() == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_measurement_runs_on_the_device(tmp_path):
    main(["--out", str(tmp_path), "--preset", "tiny", "--device", "cuda", "--resolutions", "64", "--steps", "3"])
    measured = json.loads((tmp_path / "measured.json").read_text())
    assert measured["gpu"] != "cpu" and measured["rows"][0]["plain_s"] > 0
