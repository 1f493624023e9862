import math

import pytest
import torch

from spotlight.rl.grpo import (gaussian_kl_same_std, gaussian_logprob, group_advantages, group_std, kl_k3,
                            masked_mean, ppo_clip_loss)


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0])
    adv = group_advantages(r, 4, eps=0.0 + 1e-12)
    # group 1: mean 2.5, population std sqrt(1.25)
    s = math.sqrt(1.25)
    assert adv[:4].tolist() == pytest.approx([-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s], rel=1e-6)
    assert adv[4:].tolist() == [0.0] * 4  # no variance, no signal
    assert group_std(r, 4).tolist() == pytest.approx([s, 0.0])


def test_group_advantages_eps_and_clip():
    r = torch.tensor([0.0, 0.0, 0.0, 1.0])  # mean .25, std sqrt(3)/4
    adv = group_advantages(r, 4, eps=0.1, clip=1.0)
    std = math.sqrt(3) / 4
    assert adv[0].item() == pytest.approx(-0.25 / (std + 0.1))
    assert adv[3].item() == 1.0  # 0.75 / (0.433 + 0.1) = 1.41, clipped
    with pytest.raises(ValueError):
        group_advantages(torch.ones(6), 4)


def test_ppo_clip_loss_by_hand():
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.0, 1.5, 0.5, 1.5]))
    adv = torch.tensor([2.0, 1.0, 1.0, -1.0])
    loss, clipped = ppo_clip_loss(logp, old, adv, clip_low=0.2, clip_high=0.3)
    # ratio 1 -> -2; ratio 1.5, A>0 -> clipped to 1.3 -> -1.3; ratio .5, A>0 -> max(-.5, -.8) = -.5;
    # ratio 1.5, A<0 -> max(1.5, 1.3) = 1.5 (unclipped: PPO is pessimistic)
    assert loss.tolist() == pytest.approx([-2.0, -1.3, -0.5, 1.5])
    assert clipped.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_masked_mean_and_k3():
    x = torch.tensor([[1.0, 2.0, 100.0]])
    assert masked_mean(x, torch.tensor([[1.0, 1.0, 0.0]])).item() == 1.5
    assert kl_k3(torch.tensor([0.0]), torch.tensor([0.0])).item() == 0.0
    r = math.log(0.5)
    assert kl_k3(torch.tensor([0.0]), torch.tensor([r])).item() == pytest.approx(0.5 - r - 1)


def test_gaussian_logprob_matches_closed_form():
    g = torch.Generator().manual_seed(0)
    x, mean = torch.randn(3, 5, 2, generator=g), torch.randn(3, 5, 2, generator=g)
    std = torch.tensor([0.3, 0.7, 1.1]).view(3, 1, 1)
    expected = torch.distributions.Normal(mean, std).log_prob(x).flatten(1).mean(1)
    assert torch.allclose(gaussian_logprob(x, mean, std), expected, atol=1e-6)


def test_gaussian_kl_matches_closed_form():
    mean, ref, std = torch.tensor([[0.5, -1.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor(2.0)
    expected = torch.distributions.kl_divergence(torch.distributions.Normal(mean, std),
                                                 torch.distributions.Normal(ref, std)).mean(1)
    assert torch.allclose(gaussian_kl_same_std(mean, ref, std), expected)


def test_flow_grpo_kl_is_flow_grpos_formula():
    """flow_grpo: ((mean - ref_mean)**2).mean() / (2 * std_dev_t**2), std_dev_t without sqrt(|dt|)."""
    from spotlight.rl.flow_sde import sde_mean_std
    from spotlight.rl.grpo import flow_grpo_kl

    gen = torch.Generator().manual_seed(0)
    x, v, v_ref = (torch.randn(3, 4, 5, generator=gen) for _ in range(3))
    sigma, sigma_next, noise_level = torch.tensor([0.9, 0.5, 0.2]), torch.tensor([0.7, 0.4, 0.1]), 0.7
    mean, std = sde_mean_std(x, v, sigma, sigma_next, noise_level, 0.9)
    ref_mean, _ = sde_mean_std(x, v_ref, sigma, sigma_next, noise_level, 0.9)
    std_dev_t = (torch.sqrt(sigma / (1 - sigma)) * noise_level).view(-1, 1, 1)
    theirs = ((mean - ref_mean) ** 2).mean(dim=(1, 2)) / (2 * std_dev_t.flatten() ** 2)
    ours = flow_grpo_kl(mean, ref_mean, std, sigma_next - sigma)
    assert torch.allclose(ours, theirs, rtol=1e-5)
    assert torch.allclose(ours / gaussian_kl_same_std(mean, ref_mean, std), sigma - sigma_next, rtol=1e-5)


def test_the_dits_kl_estimator_scales_each_sde_steps_kl_by_its_dt():
    from conftest import small_dit_config
    from spotlight.rl.dit_policy import DiTPolicy
    from spotlight.rl.prompts import prompt_set

    policies = []
    for estimator in ("exact", "flow_grpo"):
        policy = DiTPolicy.from_config(small_dit_config(train={"micro_batch": 1},
                                                        grpo={"kl_beta": 0.1, "kl_estimator": estimator}))
        policy.set_reference()
        with torch.no_grad():  # the same move away from the reference in both
            for i, p in enumerate(policy.model.parameters()):
                p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
        policies.append(policy)
    prompts = prompt_set(policies[0].cfg.prompts, 0)[:2]
    rollout = policies[0].rollout(prompts, [1, 2])
    steps, sigmas = list(policies[0].sampler.sde_steps), policies[0].sampler.sigmas
    adv = torch.zeros(len(rollout))
    for row in range(len(steps) + 1):  # one (sample, step) row per part; past the first sample too
        exact, flow = (p.backward_part(rollout, adv, row)["kl"] for p in policies)
        st = steps[row % len(steps)]
        assert exact > 0 and flow == pytest.approx(exact * float(sigmas[st] - sigmas[st + 1]), rel=1e-4)


def test_informative_groups_are_those_with_a_nonzero_advantage():
    from spotlight.rl.grpo import informative_groups

    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.2, 0.5])
    assert informative_groups(group_advantages(rewards, 3), 3) == [1, 3]
    assert informative_groups(torch.zeros(6), 3) == [0, 1]  # nothing informative: nothing dropped
    with pytest.raises(ValueError, match="num_groups"):
        informative_groups(torch.zeros(5), 3)
