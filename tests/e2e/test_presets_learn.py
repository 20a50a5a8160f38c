"""Every algorithm preset learns the built-in task (fixed seed), run through the
notebook API (``rlpost.compose`` + ``rlpost.train``) in one process that keeps one
Ray for all of them: each run starts and closes its own workers and placement
group, as it does in a notebook whose Ray the user started."""

from __future__ import annotations

import logging
import os

import pytest

pytest.importorskip("vllm")

STEPS = 30
PRESETS = {
    "dapo": [],
    "ppo": [],
    "gspo": [],
    "gdpo": ["reward=arith_multi"],
    "rloo": [],
    "reinforce_pp": [],
    "dr_grpo": [],
    "cispo": [],
    "sapo": [],
    # Not presets, but the same promise: GRPO with LoRA under one-step-off rollout,
    # with fully asynchronous rollout (samples at most one update old), and with PD
    # under fully asynchronous rollout (requests in flight finish under the weights
    # they started with: PD does not interrupt them).
    "grpo_lora_one_step_off": [
        "model.lora.rank=8",
        "trainer.lr=2e-3",
        "trainer.async_mode=one_step_off",
    ],
    "grpo_fully_async": ["trainer.async_mode=fully_async"],
    "grpo_pd_fully_async": [
        "rollout=vllm_pd",
        "trainer.async_mode=fully_async",
        "async.partial_rollout=false",
    ],
}


@pytest.fixture(scope="module")
def shared_ray():
    """One Ray for the module, as a notebook's own ``ray.init``; ``train`` uses it
    and leaves it running. Sized for the largest run (PD's three roles)."""
    import ray

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TQDM_DISABLE", "1")
        ray.init(
            address="local", num_cpus=max(os.cpu_count() or 1, 4), include_dashboard=False,
            logging_level=logging.WARNING,
        )  # fmt: skip
        try:
            yield
        finally:
            ray.shutdown()


# The learning runs are opt-in (pytest -m presets), as the architecture matrix is
# (-m matrix), to keep CI short, but for fully asynchronous GRPO, the mode the
# controller does the most for. The others are each checked elsewhere by default:
# - dr_grpo, rloo, reinforce_pp, gspo, cispo, sapo differ from GRPO only in an
#   advantage estimator or a policy loss, whose arithmetic the unit tests check by hand;
# - ppo and LoRA train agent episodes in tests/integration/test_agent_modes.py (dapo,
#   one-step-off and PD with -m extended), dapo and LoRA adapter sync stream under
#   fully_async in tests/integration/test_fully_async_cli.py, PD's log-prob parity is
#   tests/integration/test_pd_cli.py's, gdpo's weights tests/integration/test_gdpo_weights.py's;
# - PPO learns on the Megatron trainer in tests/e2e/test_megatron_learns.py;
# - cispo runs three steps by default, one-step-off (test_preset_runs_short).
BY_DEFAULT = {"grpo_fully_async"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "algo",
    [a if a in BY_DEFAULT else pytest.param(a, marks=pytest.mark.presets) for a in sorted(PRESETS)],
)
def test_preset_learns(algo, tmp_path, model_cache, shared_ray):
    import ray

    from rlpost import compose, train

    args = [
        # "grpo_lora" etc. are GRPO with extra switches
        f"algo={'grpo' if algo.startswith('grpo_') else algo}",
        *PRESETS[algo],
        f"trainer.total_steps={STEPS}",
        "trainer.val_every=0",
        "trainer.seed=0",
        f"trainer.run_dir={tmp_path / 'run'}",
        f"model.cache_dir={model_cache}",
    ]
    history = train(compose(args)).history
    assert ray.is_initialized()  # the caller's Ray is left as it was
    val = [h["val/accuracy"] for h in history if "val/accuracy" in h]
    assert len(val) == 2
    # Seed 0 starts from the shipped base at 0.390 held out; each preset lifts it by at
    # least 0.15 (0.160-0.220 when measured), LoRA under one-step-off by 0.12: it
    # measured 0.150 exactly (lr 3e-3: 0.040), and another CPU's rounding moves it.
    bar = 0.12 if algo == "grpo_lora_one_step_off" else 0.15
    assert val[-1] - val[0] >= bar, val
    rewards = [h["reward/mean"] for h in history if "reward/mean" in h]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5, rewards
    trained = [h for h in history if h["step"] > 0]
    assert len(trained) == STEPS
    last = history[-1]
    if algo == "ppo":
        assert "critic/vf_loss" in last and "actor/reward_kl" in last
    if algo == "grpo_pd_fully_async":
        assert "rollout/pd/kv_transfer_rate" in last
        assert all(h["async/staleness_max"] <= 1.0 for h in trained)
        assert all(h["rollout/interrupted_requests"] == 0 for h in trained)
    if algo == "grpo_lora_one_step_off":
        assert all(h["rollout/staleness"] == 1.0 for h in history[2:])
    if algo == "grpo_fully_async":
        assert all(h["async/staleness_max"] <= 1.0 for h in trained)
        assert max(h["async/staleness_mean"] for h in trained) > 0.5  # it did run ahead
        assert all(h["async/dropped_stale"] == 0 for h in trained)
    if algo == "dapo":
        assert all("dapo/dropped_groups" in h for h in history[1:])
        assert all(h["dapo/kept_groups"] == 32 for h in history[1:])


# Three steps each through the same API and Ray, checking what each adds to GRPO's
# step. CISPO runs by default, one-step-off (each step trains on samples of the
# weights before the last update), the async mode no other default test trains in;
# sapo and rm with -m presets (SAPO's loss is checked by hand in the unit tests, and
# algo=rm runs through the CLI in tests/integration/test_preference_cli.py).
SHORT = {
    "cispo": ["actor/pg_clipfrac", "rollout/staleness"],
    "sapo": ["actor/gate_mean"],
    "rm": ["rm/loss", "rm/accuracy"],
}
SHORT_ARGS = {"cispo": ["trainer.async_mode=one_step_off"], "rm": ["data=arith_pref"]}


@pytest.mark.slow
@pytest.mark.parametrize(
    "algo",
    [a if a == "cispo" else pytest.param(a, marks=pytest.mark.presets) for a in sorted(SHORT)],
)
def test_preset_runs_short(algo, tmp_path, model_cache, shared_ray):
    from rlpost import compose, train

    run_dir = tmp_path / "run"
    args = [
        f"algo={algo}", *SHORT_ARGS.get(algo, []),
        "trainer.total_steps=3", "trainer.val_every=0", "trainer.seed=0",
        f"trainer.run_dir={run_dir}", f"model.cache_dir={model_cache}",
    ]  # fmt: skip
    history = train(compose(args)).history
    trained = [h for h in history if h["step"] > 0 and "timing/step_s" in h]
    assert len(trained) == 3
    assert all(key in h for h in trained for key in SHORT[algo]), trained[-1].keys()
    if algo == "cispo":  # the first step samples the initial weights, the others one update back
        assert [h["rollout/staleness"] for h in trained] == [0.0, 1.0, 1.0], trained
        assert max(h["actor/grad_norm"] for h in trained) > 0
    if algo == "sapo":
        # on-policy the ratio is 1, where the gate sigmoid(tau (r - 1)) 4 / tau is
        # 2 / tau: 2.0 for positive advantages (tau_pos 1), 1.905 for the others (1.05)
        assert all(1.89 < h["actor/gate_mean"] < 2.01 for h in trained), trained
    if algo == "rm":
        from rlpost.rewards.reward_model import SequenceRewardModel, chat_of

        pairs = [h["val/pair_accuracy"] for h in history if "val/pair_accuracy" in h]
        assert len(pairs) == 2 and 0.0 <= pairs[-1] <= 1.0
        model = SequenceRewardModel(str(run_dir / "final"))  # the reward model path loads it
        scores = model.score([chat_of("2+3=", "5"), chat_of("2+3=", "100")])
        assert len(scores) == 2 and all(s == s for s in scores)  # finite, one per chat
