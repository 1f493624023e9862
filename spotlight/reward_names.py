"""Reward component names: which names a reward may use, and how an error line names a component.

A run's reward is `reward.terms`: the `reward.components` list, or the one-component shorthand
`reward.name`. Every check of a component — its name at load (`spotlight.config`), the policy
kind it suits, building it (`rewards.build_component`), a user function's file
(`user_reward.check_config`), a model folder (`spotlight train`'s pre-flight), a failure while it
scores (`rewards.RewardWorker`) — names it the same way, by `component` and `component_field`:
`reward.components[1]`, `reward.components[1].function`, or for the shorthand `reward.name` and
`reward.model_path`. A name is valid when `check_name` says so, with one wording ("FIELD: expected
one of NAMES, got 'x'"). tests/spotlight/rl/test_rewards.py::test_a_component_is_named_one_way_everywhere checks
the labels, tests/spotlight/test_config.py the names.

Imports neither torch nor `spotlight.config` (which calls it while it parses a config).
"""

from __future__ import annotations

from typing import Any

from schedulers.input.files import check

BUILTIN_REWARDS = ("colour", "jpeg_compressibility", "jpeg_incompressibility", "arithmetic", "clip_score",
                   "ocr", "answer_match")
"""The rewards `spotlight.rl.rewards.BUILTIN` builds (tests/spotlight/test_config.py checks the two agree);
others come from the `spotlight.rewards` entry-point group. Named here so that a config is checked
at load without importing torch."""


def reward_names() -> list[str]:
    """Every reward name a config may use: the built-in ones and the registered entry points
    (their names only; nothing is imported)."""
    from importlib.metadata import entry_points

    return sorted(set(BUILTIN_REWARDS) | {ep.name for ep in entry_points(group="spotlight.rewards")})


def check_name(name: Any, field: str) -> None:
    """A `ConfigError` "FIELD: expected one of NAMES, got 'x'" unless `name` is a reward name
    (`reward_names`; a built-in one is known without reading the entry points)."""
    if name in BUILTIN_REWARDS:
        return
    names = reward_names()
    check(name in names, field, f"one of {', '.join(names)}", name)


def component(reward: Any, i: int) -> str:
    """How an error names term i of `reward.terms` (`reward` a `RewardConfig`): `reward.components[i]`,
    or `reward.name` for the one-component shorthand (the shorthand is its name)."""
    return f"reward.components[{i}]" if reward.components else "reward.name"


def component_field(reward: Any, i: int, field: str) -> str:
    """The dotted name of `field` of term i of `reward.terms`: `reward.components[i].FIELD`, or for
    the shorthand the reward's own `reward.FIELD` (its `name`, its `model_path`)."""
    return f"reward.components[{i}].{field}" if reward.components else f"reward.{field}"


def spec(term: Any) -> str:
    """What a component is, as its config writes it (`term` a `RewardComponent`): its reward name,
    or its function `module:callable` / `file.py:callable`."""
    return term.name if term.name is not None else term.function
