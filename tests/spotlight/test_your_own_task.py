"""A user's own task end to end, with their files rather than ours: a jsonl prompt file with
metadata, a reward written in a file of theirs, held-out evaluation prompts; the tiny DiT must
clearly learn it, and the evaluation's image grid must be there to look at."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spotlight.config import load_config, to_yaml
from spotlight.rl.prompts import COLOURS

ROOT = Path(__file__).resolve().parents[2]

# What a user writes: the target colour comes from each prompt's metadata, not from our colour table.
USER_REWARD = '''
import numpy as np

def closeness(images, prompts, metadata):
    """1 for an image whose every pixel is the prompt's `rgb`, falling off with the distance."""
    out = []
    for image, meta in zip(images, metadata):
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        dist2 = ((pixels - np.asarray(meta["rgb"], dtype=np.float32)) ** 2).sum(axis=-1)
        out.append(float(np.exp(-dist2 / 0.5).mean()))
    return out
'''


def _user_files(folder: Path) -> tuple[Path, Path, Path]:
    names = list(COLOURS)
    train = folder / "prompts.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"a {n} image", "rgb": COLOURS[n]}) + "\n" for n in names[:8]))
    held_out = folder / "eval.jsonl"
    held_out.write_text("".join(json.dumps({"prompt": f"a {n} image", "rgb": COLOURS[n]}) + "\n" for n in names[:2]))
    reward = folder / "my_reward.py"
    reward.write_text(USER_REWARD)
    return train, held_out, reward


@pytest.mark.slow
def test_the_tiny_dit_learns_a_user_reward_from_a_file_on_a_prompt_file(tmp_path):
    train, held_out, reward = _user_files(tmp_path)
    cfg = load_config(ROOT / "experiments/tiny_dit.yaml", {
        "prompts": {"path": str(train), "eval_path": str(held_out)},
        "reward": {"components": [{"function": f"{reward}:closeness", "weight": 1.0}]},
        "warm_start": {"steps": 600}, "runtime": {"kind": "local"},
        "train": {"steps": 20, "eval_seeds": 3, "eval_every": 10}})
    (tmp_path / "run.yaml").write_text(to_yaml(cfg))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "train", str(tmp_path / "run.yaml"), "--out", str(out),
                           "--json", "--no-progress"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["improvement_se"] > 3, summary

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(r["reward_closeness_mean"] == r["reward_mean"] for r in rows)  # one component, weight 1
    evaluated = [r["step"] for r in rows if "eval_reward" in r]
    assert evaluated == [0, 10, 19]  # every eval_every, and the last
    assert all(r["eval_reward_closeness"] == r["eval_reward"] for r in rows if "eval_reward" in r)

    import numpy as np
    from PIL import Image

    grids = sorted((out / "eval").glob("step-*.png"))
    assert [g.name for g in grids] == ["step-000000.png", "step-000010.png", "step-000019.png"]
    grid = Image.open(grids[-1]).convert("RGB")
    # 2 held-out prompts x 3 seeds, 16-pixel samples scaled up to 128-pixel cells.
    assert grid.width == 3 * (128 + 4) + 4 and grid.height > 2 * 128
    # The top-left cell is a sample of "a red image" after training: red dominates it.
    r, g, b = np.asarray(grid.crop((4, 40, 4 + 128, 40 + 64))).reshape(-1, 3).mean(axis=0)
    assert r > g and r > b, (r, g, b)
