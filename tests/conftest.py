import os

# Ray's auth mode, explicit for every Ray these tests start themselves (`ray.init(address="local")`
# with it unset turns token auth on and writes ~/.ray/auth_token). Before `import ray`: Ray reads it once.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# No Ray these tests start reports usage to Ray's servers: nothing leaves this machine.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# Under pytest-xdist (`-n 2`, the README's test command) two test processes share the 2 cores: with
# torch's default of one OpenMP thread per core in each, two torch processes ran 20x slower than
# one (measured on this 2-core machine), so each worker, and every process it starts, computes on
# one thread. Before `import torch`: OpenMP reads it once.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

# A few test files import helpers from others by module name (`from test_cloud_store import
# final_weights`); pytest puts a test file's folder on sys.path only once it collects that file, so
# such a file run alone failed to import. Every test folder is on the path from the start.
for _folder in sorted(p.parent for p in Path(__file__).parent.rglob("test_*.py")):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

from spotlight.config import default_config  # noqa: E402
from spotlight.logs import passed_to  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """For pytest-xdist's `--dist loadscope --no-loadscope-reorder` (the README's test command, two
    workers): a module's tests run on one worker, in its order, so its module-scoped fixtures (a Ray
    cluster, a trained run) are built once; modules with a slow test are handed out first, so that
    the suite does not end waiting on one of them.

    Not `--dist loadgroup` with an `xdist_group` per module, as before: pytest-xdist 3.8 names a
    test's group by rewriting `item._nodeid`, which pytest 9.2 no longer reads (a node's id is
    `_id`), so every group was ignored and a module's tests went to both workers — each built the
    module's fixtures (measured: the Ray runtime tests' reference run twice, 89 s and 71 s)."""
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.module.__name__ not in slow_modules)  # stable: file order otherwise


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Warm starts cached by tests go to a per-session folder, never the user's cache."""
    os.environ["SPOTLIGHT_CACHE"] = str(tmp_path_factory.mktemp("spotlight-cache"))


@pytest.fixture(autouse=True)
def _no_global_rng_leaks():
    torch.manual_seed(1234)


@pytest.fixture
def logged():
    """The messages our packages log during the test, INFO and up, in order: a list that grows as
    they are logged (what a `log=lines.append` callback used to collect)."""
    lines: list[str] = []
    with passed_to(lines.append):
        yield lines


@pytest.fixture(scope="session")
def sky_python():
    """SkyPilot's Python (its own virtualenv, `make sky-venv`): skipped without one, except under CI,
    where the tests that ask SkyPilot must run."""
    from cloud import sky

    python, why = sky.sky_python()
    if python is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI asks SkyPilot itself (task validation, catalog prices), but cannot: {why}")
        pytest.skip(f"asking SkyPilot needs its virtualenv: {why}")
    return python


@pytest.fixture(scope="session")
def tiny_lm_folder(tmp_path_factory):
    """A tiny transformers causal LM folder (Qwen2, byte-level BPE tokenizer with a chat template),
    built once per session: experiments/qwen_lm_folder.py. Tests read it, never write into it."""
    from experiments.qwen_lm_folder import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("tiny-lm") / "model")


def small_dit_config(**over):
    """A tiny-DiT run small enough for unit tests: short warm start, 2 prompts x 4 samples."""
    base = {
        "warm_start": {"steps": 20, "batch_size": 8},
        "train": {"steps": 4, "prompts_per_step": 2, "group_size": 4, "checkpoint_every": 2},
        "prompts": {"count": 4},
        "sampler": {"num_steps": 4},
        "runtime": {"kind": "local"},
    }
    return _with(base, over)


def small_llm_config(**over):
    """A tiny-LLM run small enough for unit tests: short warm start, 4 prompts x 4 samples."""
    base = {
        "policy": {"kind": "llm"},
        "reward": {"name": "arithmetic"},
        "prompts": {"name": "arithmetic", "count": 16},
        "grpo": {"clip_low": 0.2, "clip_high": 0.28},
        "warm_start": {"steps": 20, "batch_size": 8, "lr": 3e-3},
        "train": {"steps": 4, "prompts_per_step": 4, "group_size": 4, "checkpoint_every": 2, "lr": 5e-4},
        "runtime": {"kind": "local"},
    }
    return _with(base, over)


def _with(base, over):
    for key, value in over.items():
        base.setdefault(key, {}).update(value) if isinstance(value, dict) else base.__setitem__(key, value)
    return default_config(base)


@pytest.fixture(scope="session")
def tiny_qwen_pipeline(tmp_path_factory):
    """A tiny real-architecture diffusers QwenImagePipeline folder (experiments/qwen_image_folder.py), saved once."""
    from experiments.qwen_image_folder import save_tiny_qwen_pipeline

    return save_tiny_qwen_pipeline(tmp_path_factory.mktemp("tiny-qwen-image") / "pipeline")
