"""What a simulation runs: the policies compared (`Policy`, `POLICIES`) and the run simulated
(`SimConfig`), every numeric field in a documented range checked at construction."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from schedulers.input.files import ConfigError, short
from spotlight.config import PARTS_PER_REQUEST
from spotlight.sim.rental import OBJECTIVES
from spotlight.sim.step_time import StepTimes


@dataclass(frozen=True)
class Policy:
    name: str
    spot: bool
    """Rolls out on the spot fleet too (else only on the on-demand GPUs)."""
    elastic: bool = True
    """Pull queue with give-back and in-place regroup; False: any preemption restarts the whole job
    from the iteration's checkpoint after a cold start (managed-jobs style), on the capacity live then."""
    explore: str = "none"
    """none | critical_path (on the on-demand GPUs before each rollout) | idle_spot (during training)."""
    oracle: bool = False
    """Knows the trace: work is spread over every live GPU as a fluid, nothing lost, no join cost."""
    all_ondemand: bool = False
    """Rents the spot fleet's peak as on-demand GPUs too (the same hardware as a spot policy, never
    preempted, at on-demand prices): every GPU rolls out and trains."""
    fleet_update: bool = False
    """The update's micro-batches are TRAIN requests every live worker pulls, spot ones included
    (`train.update_on: fleet`); else the update runs on the on-demand GPUs alone."""
    ondemand_gpus: int | None = None
    """On-demand GPUs, instead of `SimConfig.gpus` (None: that many). `near_all_spot` has 1, the
    learner's; 0 (no on-demand GPU at all: the job trains on its spot nodes) only for a
    restart-from-checkpoint job (`elastic` off), which `spotlight.sim.managed_restart` simulates."""

    def __post_init__(self) -> None:
        n = self.ondemand_gpus
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ConfigError(f"ondemand_gpus: expected None or an integer >= 0, got {short(n)}")
        if n == 0 and (self.elastic or not self.spot or self.all_ondemand or self.oracle):
            raise ConfigError("ondemand_gpus: 0 (all spot) needs spot on and elastic, all_ondemand and oracle off: "
                              "only a restart-from-checkpoint job trains on its spot nodes")


POLICIES = {
    "ondemand": Policy("ondemand", spot=False),
    "ondemand_total": Policy("ondemand_total", spot=False, all_ondemand=True),
    "spot_restart": Policy("spot_restart", spot=True, elastic=False),
    "managed_restart": Policy("managed_restart", spot=True, elastic=False, ondemand_gpus=0),
    "spotlight_noexplore": Policy("spotlight_noexplore", spot=True, fleet_update=True),
    "sync_explore": Policy("sync_explore", spot=False, explore="critical_path"),
    "spotlight_learner_update": Policy("spotlight_learner_update", spot=True, explore="idle_spot"),
    "near_all_spot": Policy("near_all_spot", spot=True, explore="idle_spot", fleet_update=True, ondemand_gpus=1),
    "spotlight": Policy("spotlight", spot=True, explore="idle_spot", fleet_update=True),
    "oracle": Policy("oracle", spot=True, explore="idle_spot", oracle=True, fleet_update=True),
}


_INT_LIMITS = {"gpus": (1, 16_384), "spot_gpus": (0, 65_536), "iterations": (1, 100_000), "resolution": (16, 8192),
               "prompts": (1, 16_384), "group_size": (2, 4096), "candidates_per_prompt": (1, 65_536),
               "sync_explore_per_prompt": (0, 65_536), "plan_prompts": (1, 4096), "commit_every": (1, 1000),
               "checkpoint_every": (1, 100_000), "seed": (0, 2**32 - 1), "micro_batch": (1, 65_536),
               "parts_per_request": (1, 4096), "updates_per_step": (1, 1000), "learner_gpus": (1, 16_384)}
"""[low, high] of SimConfig's integer fields (None allowed where the field says so). The maxima bound
what one run allocates — a worker and its members per GPU, a request per group — well above the
4,096-GPU x 1,000-iteration run `experiments/simulate_scale.py` times (docs/fleet-engine.md)."""
_FLOAT_LIMITS = {"notice_s": (0.0, 3600.0, False), "join_s": (0.0, 86400.0, False), "checkpoint_s": (0.0, 86400.0, False),
                 "iterations_scale": (0.0, 1000.0, True), "budget_usd": (0.0, 1e9, True)}
"""(low, high, whether low itself is excluded) of SimConfig's float fields; every one is finite."""


@dataclass(frozen=True)
class SimConfig:
    """What to simulate; every numeric field is in the range `_INT_LIMITS` / `_FLOAT_LIMITS` give
    (checked at construction, the error naming the field)."""

    gpus: int = 16
    """On-demand GPUs, the same for every policy: they train, and roll out during the rollout; 1..16,384."""
    spot_gpus: int | None = None
    """Spot GPUs at the trace's peak (a trace node is a block of spot_gpus // max_live GPUs), 0..65,536;
    None: 4 x gpus (spot costs ~0.3-0.45x on-demand, so the fleet a budget buys is mostly spot)."""
    iterations: int = 300
    """Most iterations simulated (the run stops at the target unless stop_at_target is off); 1..100,000."""
    resolution: int = 512
    """Image side in pixels, 16..8,192."""
    prompts: int = 64
    """Prompts per iteration (64 x 16 = 1024 images, Flow-GRPO's batch size class); 1..16,384."""
    group_size: int = 16
    """Samples per prompt, 2..4,096."""
    samples_per_request: int | None = None
    """Samples per request, 1..group_size; None: the group, halved while there are fewer requests than
    6x the SP groups at the fleet's peak (so the pull queue can balance)."""
    candidates_per_prompt: int = 64
    """Seeds explored per prompt at most, group_size..65,536."""
    sync_explore_per_prompt: int = 32
    """sync_explore's fixed exploration samples per prompt (2G), scored before each rollout; 0..65,536."""
    plan_prompts: int = 16
    """Prompts the real planner plans over, 1..4,096; each stands for prompts / plan_prompts alike prompts
    (the bandit's cost grows with prompts: 90 ms an iteration at 64 prompts)."""
    planner: str = "bandit"
    """bandit or uniform (`planners.allocation.make_planner`)."""
    notice_s: float = 120.0
    """Preemption warning in seconds, 0..3,600 (AWS: 120 s, GCP: 30 s, 0: none)."""
    commit_every: int = 1
    """Denoising steps between commits, 1..1,000."""
    join_s: float = 240.0
    """A trace node's arrival to its GPUs serving, 0..86,400 s: a new spot VM goes through
    provisioning and container start (~2-3 min on managed spot, as `StepTimes.cold_start_s`: 180 s
    taken), its agent and members (~10 s), the pipeline's weights from a peer node rather than
    object storage (~58 GB: the 41 GB transformer, a 16.6 GB text encoder, the VAE, at 100 Gbit/s
    across zones x 0.5: ~9 s, `spotlight.sim.transfers`) and their load into GPU memory and warm-up
    (~20 s): ~220 s, 240 s with a margin. An assumption; the earlier 60 s left out the VM's start."""
    checkpoint_every: int = 1
    """`managed_restart`: iterations between its checkpoints, 1..100,000. A restart loses the
    iterations done since the last one. Every iteration by default: a write costs `checkpoint_s`,
    far less than the iteration a loss would otherwise throw away (100-400 s at the defaults)."""
    checkpoint_s: float = 5.0
    """Seconds a checkpoint write holds the run up, 0..86,400 (`managed_restart` writes one every
    `checkpoint_every` iterations; a simulated run config sets its own). The default is the blocking
    part of an asynchronous sharded save (as PyTorch DCP's `async_save`): the trainer state copied
    to host memory over the cluster's GPUs — LoRA's adapters and Adam state, ~5 GB, well under a
    second; full-parameter training's 204 GB, ~1 s on 8 H100s at ~25 GB/s each — plus the commit.
    The upload to object storage (2.5-100 s at 2 GB/s) overlaps the next iteration and is taken as
    durable when the write ends — in the baseline's favour (live, a loss during the upload falls
    back to the checkpoint before, and an upload longer than an iteration backs up)."""
    seed: int = 0
    """0..2**32 - 1."""
    stop_at_target: bool = True
    iterations_scale: float = 10.0
    """Stretch the progress model's iteration axis, in (0, 1,000]: the tiny DiT's random-seed
    baseline reaches the target in 17.7 iterations; a Qwen-Image run needs hundreds (Flow-GRPO trains
    for hundreds to thousands of steps), so by default 10x: 177 (docs/simulator.md)."""
    micro_batch: int = 4
    """(sample, trained SDE step) rows per micro-batch of the update, 1..65,536: `train.micro_batch`
    of the run simulated (4: the Qwen-Image OCR recipe's, flow_grpo's `train.batch_size` per GPU).
    With `parts_per_request` it sets the update's grain, as the runtime's (`gradient_parts`)."""
    parts_per_request: int = PARTS_PER_REQUEST
    """Micro-batches per `TRAIN` request, 1..4,096: `train.parts_per_request` of the run simulated
    (its default: 8). A request is served by a node's crew and sends one gradient."""
    updates_per_step: int = 1
    """Optimiser steps (update rounds) per iteration, 1..1,000: `train.updates_per_step` (the Qwen-Image
    recipe's: 1); each round is the whole update's work and the learner's gather and step."""
    learner_gpus: int | None = None
    """GPUs the update runs on when the learner computes it alone, 1..16,384; None: every on-demand
    GPU (the named policies' trainer, data parallel over them; a full fine-tune's group up to one
    node's). A simulated run config: its `train.learner_gpus` — one learner process, or a full
    fine-tune's group of that many (`spotlight.runtime.learner_group`, paid for beside the
    rollout workers), however many on-demand rollout workers the run has
    (`Simulation.learner_update_s`)."""
    step_times: StepTimes = field(default_factory=StepTimes)
    """The step-time model. Its `gradient_parts` and `parts_per_request` are this run's grain: set
    from `prompts` x `group_size` x `trained_steps` / `micro_batch` and `parts_per_request` here."""
    price_gpu: str | None = None
    """GPU row of the price table (None: step_times.gpu; the tiny-cpu profile, which no table prices,
    is priced as an H100). A GPU the table does not price is refused by `gpu_prices`."""
    prices: str | None = None
    """Price table CSV (None: the shipped cloud/prices.csv)."""
    budget_usd: float | None = None
    """Stop before this would be exceeded, decided before every iteration by the live trainer's
    budget policy (`cloud.cost.BudgetPolicy` over a `Forecast` of measured iteration times) on the
    simulated clock; the oracle, a bound, ignores it. In (0, 1e9] dollars."""
    objective: str = "time"
    """How many of the spot nodes on offer the elastic spot policies and the oracle hold
    (`spotlight.sim.rental`): time (every one, the soonest run), cost (the count that makes an
    iteration cheapest) or deadline (the cheapest count whose forecast reaches the target within
    `deadline_h`). The restart baseline's job holds its cluster whatever it is."""
    deadline_h: float | None = None
    """With objective deadline (and only then): hours from the start by which the target should be
    reached, in (0, 1e6]."""

    def __post_init__(self) -> None:
        for name, (low, high) in _INT_LIMITS.items():
            v = getattr(self, name)
            if v is None and name in ("spot_gpus", "learner_gpus"):
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise ConfigError(f"{name}: expected an integer in [{low:,}, {high:,}], got {short(v)}")
        for name, (low, high, open_low) in _FLOAT_LIMITS.items():
            v = getattr(self, name)
            if v is None and name == "budget_usd":
                continue
            number = not isinstance(v, bool) and isinstance(v, (int, float))
            if not (number and low <= v <= high and not (open_low and v == low)):  # (nan fails low <= v)
                raise ConfigError(f"{name}: expected a number {'>' if open_low else '>='} {low:g} and at most "
                                  f"{high:,.0f}, got {short(v)}")
        if self.samples_per_request is not None and not (
                isinstance(self.samples_per_request, int) and 1 <= self.samples_per_request <= self.group_size):
            raise ConfigError(f"samples_per_request: expected 1..group_size, got {short(self.samples_per_request)}")
        if self.candidates_per_prompt < self.group_size:
            raise ConfigError(f"candidates_per_prompt: expected >= group_size ({self.group_size})")
        if self.planner not in ("bandit", "uniform"):
            raise ConfigError(f"planner: expected bandit or uniform, got {short(self.planner)}")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective: expected {', '.join(OBJECTIVES[:-1])} or {OBJECTIVES[-1]}, "
                              f"got {short(self.objective)}")
        if (self.objective == "deadline") != (self.deadline_h is not None):
            raise ConfigError("deadline_h: required with objective deadline (the hours to reach the target in)"
                              if self.deadline_h is None else
                              f"deadline_h: only with objective deadline (objective is {self.objective})")
        d = self.deadline_h
        if d is not None and not (not isinstance(d, bool) and isinstance(d, (int, float)) and 0 < d <= 1e6):
            raise ConfigError(f"deadline_h: expected a number > 0 and at most 1,000,000, got {short(d)}")
        # The update's grain is the run's, as the runtime's requests are (one grain: the simulator's
        # TRAIN requests and their bytes are the live ones, tests/spotlight/sim/test_transfer_bytes.py).
        st = self.step_times
        if (st.gradient_parts, st.parts_per_request) != (self.gradient_parts, self.parts_per_request):
            object.__setattr__(self, "step_times", replace(st, gradient_parts=self.gradient_parts,
                                                           parts_per_request=self.parts_per_request))

    @property
    def gradient_parts(self) -> int:
        """Micro-batches per update round, as the runtime splits the update (`DiTPolicy.update_parts`):
        ceil(samples x trained SDE steps / `micro_batch`)."""
        rows = self.prompts * self.group_size * self.step_times.trained_steps
        return max(1, -(-rows // self.micro_batch))

    @property
    def peak_spot_gpus(self) -> int:
        return 4 * self.gpus if self.spot_gpus is None else self.spot_gpus
