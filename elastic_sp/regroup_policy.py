"""The regroup policy: which SP groups (how many, of which degree, with which members) to form.

A pure function of what is alive and what the work looks like — the devices alive (and the node
each sits on), the sequence length (from the resolution), the attention heads, a step-time model
and how many requests are waiting — so the live coordinator and the trace-replay simulator call
the same code with the same inputs. Nothing here touches torch.distributed, a process or a clock.

Vocabulary (fixed across `elastic_sp`): a *member* is one device (one process) by name; a *group*
is the members that run one sequence-parallel forward together; its *degree* is how many members
it has; a member's *rank* is its index in the group.

Rules the policy keeps:
- Ulysses splits the attention heads over the group, so a degree must divide the heads
  (`check_degree` is the one place that says so, and its error names the numbers).
- A busy group whose members are all alive is never touched: regrouping it would throw away the
  step it is computing. Only broken groups' survivors, idle groups and free members are re-planned.
- Among the degree mixes it tries, it picks the one that finishes the waiting requests soonest
  (list scheduling on the step-time model), then the one with the higher throughput, then the one
  with fewer groups. Groups stay inside one node where they fit (all-to-all across nodes is slow).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


def check_degree(heads: int, degree: int, devices: int | None = None) -> None:
    """Raise ValueError unless an SP group of `degree` members can run a model with `heads` heads
    (on `devices` devices, when given). Ulysses gives each rank heads/degree whole heads."""
    if degree < 1:
        raise ValueError(f"SP degree must be >= 1, got {degree}")
    if degree > heads:
        raise ValueError(f"SP degree {degree} exceeds the model's {heads} attention heads: "
                         f"Ulysses gives each rank whole heads, so degree <= heads")
    if heads % degree != 0:
        raise ValueError(f"SP degree {degree} does not divide the model's {heads} attention heads "
                         f"({heads} % {degree} = {heads % degree}); valid degrees: {valid_degrees(heads)}")
    if devices is not None and degree > devices:
        raise ValueError(f"SP degree {degree} needs {degree} devices, only {devices} alive")


def valid_degrees(heads: int, devices: int | None = None, seq_len: int | None = None,
                  max_tokens_per_device: int | None = None) -> list[int]:
    """Degrees, ascending, that divide `heads`, fit in `devices` and keep at most
    `max_tokens_per_device` image tokens of `seq_len` on each member (the memory floor)."""
    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    out = []
    for d in range(1, heads + 1):
        if heads % d or (devices is not None and d > devices):
            continue
        if max_tokens_per_device is not None and seq_len is not None and math.ceil(seq_len / d) > max_tokens_per_device:
            continue
        out.append(d)
    return out


class StepTimeModel(Protocol):
    def __call__(self, seq_len: int, degree: int) -> float:
        """Seconds for one denoising step of one request of `seq_len` image tokens on a group of
        `degree` members."""
        ...


@dataclass(frozen=True)
class UlyssesStepTime:
    """t(S, d) = (a·S + b·S²) / d + [d > 1] · collectives · (latency + c · S / d).

    Compute splits evenly over the group (linear layers per token, attention per token pair);
    each Ulysses all-to-all moves a rank's S/d tokens and pays a fixed latency. The defaults
    estimate Qwen-Image (20B) on H100s with NVLink, where wide groups pay off at high resolution."""

    s_per_token: float = 1e-4
    """2 FLOP x 20e9 parameters per token at ~400 TFLOP/s of bf16: 1e-4 s."""
    s_per_token_pair: float = 2e-9
    """60 blocks x 4 x 3072 (q·k and p·v) FLOP per token pair at ~400 TFLOP/s: ~2e-9 s."""
    latency_s: float = 2e-5
    """One NVLink all-to-all's fixed cost."""
    s_per_token_moved: float = 1e-7
    """q, k, v of a token (3 x 3072 bf16 = 18 KB) at ~200 GB/s."""
    collectives_per_step: int = 121
    """2 all-to-alls per block + the output gather: 2 · 60 + 1 for Qwen-Image's 60 blocks."""

    def __call__(self, seq_len: int, degree: int) -> float:
        compute = (self.s_per_token * seq_len + self.s_per_token_pair * seq_len ** 2) / degree
        comm = 0.0 if degree == 1 else self.collectives_per_step * (self.latency_s + self.s_per_token_moved * seq_len / degree)
        return compute + comm


@dataclass(frozen=True)
class MeasuredStepTime:
    """Step times measured per degree at one sequence length, scaled linearly to other lengths."""

    seq_len: int
    seconds: Mapping[int, float]

    def __call__(self, seq_len: int, degree: int) -> float:
        if degree not in self.seconds:
            raise ValueError(f"no measured step time for degree {degree} (have {sorted(self.seconds)})")
        return self.seconds[degree] * seq_len / self.seq_len


@dataclass(frozen=True)
class TargetDegree:
    """A configured degree (`runtime.sp_degree`): width pays up to `degree` — t = 1/d, so that the
    policy's tie-breaks (equal makespan and throughput, then fewer groups) pick groups of `degree`
    and the remainder as wide as it goes — and a wider group is never worth it."""

    degree: int

    def __call__(self, seq_len: int, degree: int) -> float:
        return 1.0 / degree if degree <= self.degree else float("inf")


def plan_degrees(devices: int, seq_len: int, heads: int, step_time: StepTimeModel, pending: int = 1,
                 max_tokens_per_device: int | None = None) -> list[int]:
    """The degrees of the groups to form from `devices` free devices, largest first (may leave
    devices unused; [] when no valid group fits). `pending`: requests waiting to be served.

    Candidates: for each valid degree d, as many groups of d as fit, the rest filled with the
    largest valid degree that fits, again and again. Picked: the smallest makespan of `pending`
    requests (each to the group that would finish it first), then the largest throughput
    Σ 1/t(d), then the fewest groups."""
    if devices < 0 or seq_len < 1 or pending < 0:
        raise ValueError(f"need devices >= 0, seq_len >= 1, pending >= 0; got {devices}, {seq_len}, {pending}")
    degrees = valid_degrees(heads, devices, seq_len, max_tokens_per_device)
    if not degrees:
        return []
    best: tuple[tuple[float, float, int], list[int]] | None = None
    for d in degrees:
        mix = [d] * (devices // d)
        left = devices - sum(mix)
        while left and (fill := [x for x in degrees if x <= left]):
            mix.append(fill[-1])
            left -= fill[-1]
        times = [step_time(seq_len, x) for x in mix]
        key = (_makespan(times, max(pending, 1)), -sum(1 / t for t in times), len(mix))
        if best is None or key < best[0]:
            best = (key, sorted(mix, reverse=True))
    return best[1]


def _makespan(times: Sequence[float], requests: int) -> float:
    """When the last of `requests` equal requests ends if each goes to the group that would finish
    it soonest (per-request cost: a group's step time; steps per request cancel out)."""
    finish = [(t, i) for i, t in enumerate(times)]  # when each group would finish its next request
    heapq.heapify(finish)
    end = 0.0
    for _ in range(requests):
        t, i = heapq.heappop(finish)
        end = max(end, t)
        heapq.heappush(finish, (t + times[i], i))
    return end


@dataclass(frozen=True)
class RegroupPlan:
    keep: list[list[str]]
    """Groups that stay as they are (busy and intact, or idle and re-planned identically)."""
    form: list[list[str]]
    """New groups to form, members in rank order."""
    free: list[str] = field(default_factory=list)
    """Alive members in no group."""

    @property
    def degrees(self) -> list[int]:
        return sorted((len(g) for g in self.keep + self.form), reverse=True)


def regroup(groups: Sequence[Sequence[str]], busy: Collection[int], alive: Mapping[str, str], seq_len: int,
            heads: int, step_time: StepTimeModel, pending: int = 1,
            max_tokens_per_device: int | None = None) -> RegroupPlan:
    """Re-plan the groups after a membership change.

    groups: the current groups (member names in rank order); busy: indexes into `groups` of the
    groups computing a request; alive: member name -> node for every live member (members of
    `groups` missing from it are lost). Busy intact groups are kept; everything else alive is
    pooled and partitioned by `plan_degrees` (with `pending` requests waiting), each new group
    placed on one node when one has room (the fullest-fitting node first), else across nodes."""
    keep: list[list[str]] = []
    pooled_groups: list[list[str]] = []
    idle_intact: dict[frozenset[str], list[str]] = {}
    grouped: set[str] = set()
    for i, g in enumerate(groups):
        grouped.update(g)
        intact = all(m in alive for m in g)
        if i in busy and intact:
            keep.append(list(g))
            continue
        pooled_groups.append([m for m in g if m in alive])
        if intact:
            idle_intact[frozenset(g)] = list(g)
    pool = [m for g in pooled_groups for m in g] + [m for m in alive if m not in grouped]
    degrees = plan_degrees(len(pool), seq_len, heads, step_time, pending, max_tokens_per_device)
    by_node: dict[str, list[str]] = {}
    for m in pool:  # pool order (old groups first, rank order) keeps placements stable
        by_node.setdefault(alive[m], []).append(m)
    planned: list[list[str]] = []
    for d in degrees:
        fits = [n for n, ms in by_node.items() if len(ms) >= d]
        if fits:
            node = min(fits, key=lambda n: (len(by_node[n]), n))  # best fit: least room left over
            planned.append(by_node[node][:d])
            by_node[node] = by_node[node][d:]
        else:  # span nodes, taking from the fullest first so fewer nodes are involved
            members: list[str] = []
            for node in sorted(by_node, key=lambda n: (-len(by_node[n]), n)):
                take = by_node[node][: d - len(members)]
                members += take
                by_node[node] = by_node[node][len(take):]
                if len(members) == d:
                    break
            planned.append(members)
    form = []
    for g in planned:
        if frozenset(g) in idle_intact:
            keep.append(idle_intact[frozenset(g)])  # an idle group planned again: no need to re-form it
        else:
            form.append(g)
    used = {m for g in keep + form for m in g}
    return RegroupPlan(keep=keep, form=form, free=[m for m in alive if m not in used])
