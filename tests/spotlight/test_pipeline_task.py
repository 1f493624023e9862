"""The issue's whole user path in one run: a real-architecture QwenImagePipeline folder, a flow_grpo
dataset folder of prompts, the OCR reward plus a reward of the user's in a file, LoRA — through
`spotlight train` as a user types it. Locally and on Ray it ends with the same adapters bit for bit,
a SIGKILL after a checkpoint resumes to them too, and `final/` loads through the real pipeline."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from conftest import small_dit_config
from spotlight.config import to_yaml

USER_REWARD = '''
import numpy as np

def contrast(images, prompts, metadata):
    """The spread of the image's grey levels: a sign needs ink on a background."""
    return [float(np.asarray(image.convert("L"), dtype=np.float32).std() / 255.0) for image in images]
'''


def _inputs(folder: Path, pipeline: Path, runtime: str) -> Path:
    data = folder / "dataset" / "ocr"
    data.mkdir(parents=True)
    (data / "train.txt").write_text('A shop sign that says "OPEN"\nA street sign reading "STOP"\n'
                                    'A poster with the word "SALE"\nA door plate saying "EXIT"\n')
    (data / "test.txt").write_text('A banner that says "HELLO"\n')
    (folder / "rewards.py").write_text(USER_REWARD)
    cfg = small_dit_config(
        # `policy.pretrained_path`, as the issue names it: the DiT's folder (policy.dit.pretrained_path).
        policy={"pretrained_path": str(pipeline), "dit": {"resolution": 64}, "lora": {"rank": 4, "alpha": 8}},
        prompts={"path": "dataset/ocr"},
        reward={"components": [{"name": "ocr", "weight": 1.0}, {"function": "rewards.py:contrast", "weight": 2.0}]},
        warm_start={"steps": 0},
        train={"steps": 4, "prompts_per_step": 2, "group_size": 2, "checkpoint_every": 2, "lr": 3e-2,
               "updates_per_step": 1, "eval_prompts": 1, "eval_seeds": 2, "eval_every": 2},
        runtime={"kind": runtime, "spot_workers": 1, "ondemand_workers": 1})
    (folder / "run.yaml").write_text(to_yaml(cfg))
    return folder / "run.yaml"


def _train(folder: Path, out: str, kill_after: int | None = None) -> tuple[int, str]:
    """`spotlight train run.yaml --out OUT` in `folder` (relative paths as a user has them): its exit
    code and output; with `kill_after`, SIGKILLed as soon as the checkpoint of that iteration is complete."""
    proc = subprocess.Popen([sys.executable, "-m", "spotlight.cli", "train", "run.yaml", "--out", out, "--no-progress"],
                            cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after is not None:
        manifest = folder / out / "checkpoints" / f"step-{kill_after:06d}" / "MANIFEST.json"
        deadline = time.monotonic() + 300
        while not manifest.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    out_text, err = proc.communicate(timeout=600)
    assert kill_after is not None or proc.returncode == 0, err
    return proc.returncode, out_text + err


def _adapters(folder: Path, out: str) -> dict:
    return load_file(str(folder / out / "final" / "pytorch_lora_weights.safetensors"))


@pytest.mark.slow
def test_a_pipeline_folder_with_prompt_files_ocr_and_a_user_reward_trains_locally_and_on_ray_alike(
        tiny_qwen_pipeline, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    _inputs(local, tiny_qwen_pipeline, "local")
    _train(local, "straight")
    straight = _adapters(local, "straight")

    rows = [json.loads(line) for line in (local / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows:  # both components are measured, and the reward is their weighted sum
        assert r["reward_mean"] == pytest.approx(r["reward_ocr_mean"] + 2.0 * r["reward_contrast_mean"], abs=1e-6)
        assert 0 <= r["reward_ocr_mean"] <= 1 and r["reward_contrast_std"] > 0
    assert [r["step"] for r in rows if "eval_reward_ocr" in r] == [0, 2, 3]
    assert sorted(p.name for p in (local / "straight" / "eval").iterdir()) == [
        "step-000000.png", "step-000002.png", "step-000003.png"]

    # Killed right after the checkpoint of iteration 2, then the same command again: the same adapters.
    code, _ = _train(local, "killed", kill_after=2)
    assert code == -signal.SIGKILL and not (local / "killed" / "summary.json").exists()
    _, said = _train(local, "killed")
    assert "resuming from" in said
    assert all((_adapters(local, "killed")[k] == v).all() for k, v in straight.items())

    ray = tmp_path / "ray"
    ray.mkdir()
    _inputs(ray, tiny_qwen_pipeline, "ray")
    _train(ray, "out")
    on_ray = _adapters(ray, "out")
    assert on_ray.keys() == straight.keys() and all((on_ray[k] == v).all() for k, v in straight.items())

    # final/ is what a user loads: the real pipeline with the adapters, sampling at the run's size.
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(str(tiny_qwen_pipeline), local_files_only=True)
    pipe.load_lora_weights(str(local / "straight" / "final"))
    pipe.set_progress_bar_config(disable=True)
    image = pipe('A sign that says "OPEN"', num_inference_steps=2, height=64, width=64, output_type="pt").images
    assert image.shape == (1, 3, 64, 64)
    card = (local / "straight" / "final" / "README.md").read_text()
    assert "1 x ocr + 2 x rewards.py:contrast" in card and "- Prompts: ocr" in card
    assert f'QwenImagePipeline.from_pretrained("{tiny_qwen_pipeline}")' in card
