"""``algo.off_policy``: its config, how it reaches the trainer, and the policy objective."""

import math

import pytest
import torch

from rlpost.algos import LossNorm, OffPolicyConfig, PolicyLossConfig
from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.plan.algo import algo_settings
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.objectives import RegularizerConfig, policy_objective

LN = math.log


def _problems(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        compose(overrides)
    return str(info.value)


def test_default_is_the_token_truncated_weight_at_two():
    # the trainer's correction before algo.off_policy existed: min(pi_old / pi_rollout, 2)
    assert algo_settings(compose([])).off_policy == OffPolicyConfig("token_is", is_cap=2.0)


def test_settings_reach_the_algos_config():
    cfg = compose(["algo.off_policy.name=mis", "algo.off_policy.lo=0.9", "algo.off_policy.hi=1.1"])
    assert algo_settings(cfg).off_policy == OffPolicyConfig("mis", lo=0.9, hi=1.1)


def test_a_verl_rejection_criterion_takes_its_kl_bound_from_the_config():
    cfg = compose(["algo.off_policy.name=seq_mean_k3", "algo.off_policy.kl_max=0.05"])
    assert algo_settings(cfg).off_policy == OffPolicyConfig("seq_mean_k3", kl_max=0.05)
    assert "algo.off_policy.kl_max=0.0" in _problems(["algo.off_policy.kl_max=0"])


def test_the_removed_rollout_is_cap_is_an_unknown_key():
    # algo.rollout_is_cap=C is now algo.off_policy.name=token_is algo.off_policy.is_cap=C
    msg = _problems(["algo.rollout_is_cap=3.0"])
    assert "algo.rollout_is_cap: unknown key; algo accepts:" in msg and "off_policy" in msg


def test_bad_off_policy_settings_are_all_named():
    # the group's own checks (its fields, then OffPolicyConfig's rules across them), then
    # the registry's, which needs the whole config
    assert "algo.off_policy.delta=-1.0: must be >= 0" in _problems(["algo.off_policy.delta=-1"])
    msg = _problems(["algo.off_policy.lo=3.0"])
    assert "algo.off_policy.lo=3.0: must be < algo.off_policy.hi=2.0" in msg
    msg = _problems(["algo.off_policy.name=nope"])
    assert "algo.off_policy.name='nope'" in msg and "token_is" in msg
    assert "algo.off_policy.hi=0.5" in _problems(["algo.off_policy.hi=0.5"])


def _objective(**kwargs):
    # one sample, three response tokens, A = 1, logp = old (r = 1): rollout rho = 1, 1.5, 3
    old_bt = torch.tensor([[0.0, LN(1.5), LN(3.0)]])
    logp_bt = old_bt.clone().requires_grad_(True)
    mb = TrajectoryBatch(
        input_ids_bt=torch.zeros(1, 3, dtype=torch.long),
        attention_mask_bt=torch.ones(1, 3),
        response_mask_bt=torch.ones(1, 3),
        rollout_logp_bt=torch.zeros(1, 3),
        advantages_bt=torch.ones(1, 3),
    )
    loss, metrics = policy_objective(
        logp_bt, torch.zeros(1, 3), old_bt, mb, PolicyLossConfig(), RegularizerConfig(),
        LossNorm(3, 1), **kwargs,
    )  # fmt: skip
    loss.backward()
    return loss, metrics, logp_bt.grad


def test_objective_default_equals_the_old_is_cap_path():
    loss_old, m_old, g_old = _objective(is_cap=2.0)
    loss_new, m_new, g_new = _objective(off_policy=OffPolicyConfig())
    assert loss_new.item() == loss_old.item() and torch.equal(g_new, g_old)
    # loss = -(1 + 1.5 + 2) / 3 = -1.5 ; the old metric names stay
    assert loss_new.item() == pytest.approx(-1.5)
    assert m_new["rollout/is_weight_mean"] == pytest.approx(1.5)
    assert m_new["rollout/is_capped_frac"] == pytest.approx(1 / 3)
    assert m_new["off_policy/is_mean"] == pytest.approx(1.5)


def test_objective_applies_the_chosen_correction_and_reports_it():
    loss, m, grad = _objective(off_policy=OffPolicyConfig("decoupled", is_cap=2.0))
    # rho = 3 > 2 dropped: loss = -(1 + 1.5 + 0) / 3 ; d loss / d logp = -(1, 1.5, 0) / 3
    assert loss.item() == pytest.approx(-2.5 / 3)
    torch.testing.assert_close(grad, -torch.tensor([[1.0, 1.5, 0.0]]) / 3)
    assert m["off_policy/rejected_frac"] == pytest.approx(1 / 3)
    assert "rollout/is_capped_frac" not in m


def test_objective_without_a_correction_is_plain_ppo():
    loss, m, _ = _objective(off_policy=OffPolicyConfig("none"))
    assert loss.item() == pytest.approx(-1.0)  # -(1 + 1 + 1) / 3
    assert m["off_policy/kl_behav"] == pytest.approx(-LN(4.5) / 3)  # still measured
