"""One epoch, one mini-batch: the update's own log-probs, detached, stand in for the
separate old-log-prob forward without changing the update.

Shapes: b = samples, t = tokens.

Each variant builds two engines from the same model and seed in one process: one
runs ``logprobs`` and then ``update_policy`` (the separate forward), the other
``update_policy_single_pass``. Loss, gradient norm, the truncated importance
weights, the weights after the step and the log-probs must agree.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from engine_utils import DEVICES, advantages, engine, free_port, make_batch, spawn

from rlpost.algos import PolicyLossConfig
from rlpost.models.tiny import build_tiny_model
from rlpost.trainers.fsdp.engine import RegularizerConfig
from rlpost.trainers.fsdp.lora import LoraSettings

VARIANTS = {
    "padded_micro": dict(micro_batch_size=3),
    "packed_micro": dict(micro_batch_size=3, packing=True),
    "lora": dict(micro_batch_size=8, lora=LoraSettings(rank=4)),
}
# Every term of the policy loss: the entropy bonus, a KL loss and truncated IS.
REG = RegularizerConfig(entropy_coef=0.01, kl_coef=0.1)
IS_CAP = 2.0
LR = 1e-3


def _weights(eng) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in eng.named_weights()}


def _worker(rank: int, model_dir: str, port: int, out: str, device: str) -> None:
    results: dict = {}
    for name, kw in VARIANTS.items():
        batch = make_batch()
        batch.advantages_bt = advantages(batch)
        separate = engine(model_dir, rank, 1, port, device, lr=LR, **kw)
        old_bt = separate.logprobs(batch)
        # The rollout sampled with other numbers: alternate tokens 1 nat above (w = e^-1)
        # and below (w = e, capped at 2) the trainer's log-probs.
        sign_bt = torch.ones_like(old_bt)
        sign_bt[:, ::2] = -1.0
        batch.rollout_logp_bt = (old_bt + sign_bt) * batch.response_mask_bt
        batch.ref_logp_bt = (old_bt - 0.5) * batch.response_mask_bt
        initial = _weights(separate)
        m_sep = separate.update_policy(
            replace(batch, old_logp_bt=old_bt), PolicyLossConfig(), reg=REG, is_cap=IS_CAP
        )
        w_sep = _weights(separate)
        del separate
        fused = engine(model_dir, rank, 1, port, device, lr=LR, **kw)
        m_one, logp_bt = fused.update_policy_single_pass(
            batch, PolicyLossConfig(), reg=REG, is_cap=IS_CAP
        )
        results[name] = dict(
            m_sep=m_sep, m_one=m_one, initial=initial, w_sep=w_sep, w_one=_weights(fused),
            old=old_bt, logp=logp_bt,
        )  # fmt: skip
        del fused
    dropout = engine(model_dir, rank, 1, port, device, lora=LoraSettings(rank=4, dropout=0.1))
    plain = engine(model_dir, rank, 1, port, device)
    results["has_dropout"] = (dropout.has_dropout(), plain.has_dropout())
    torch.save(results, out)


@pytest.fixture(scope="module", params=DEVICES)
def results(request, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("single_pass")
    model_dir = str(build_tiny_model("micro", tmp / "m", 0, init_std=0.3))
    spawn(_worker, (model_dir, free_port(), str(tmp / "out.pt"), request.param))
    return torch.load(tmp / "out.pt", weights_only=False)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_single_pass_update_equals_update_after_a_separate_forward(results, variant):
    r = results[variant]
    m_sep, m_one = r["m_sep"], r["m_one"]
    for key in ("actor/loss", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
        assert m_one[key] == pytest.approx(m_sep[key], rel=1e-6, abs=1e-7), key
    # ratio = exp(logp - old) = e^0 = 1 on both sides: the PPO clip is inactive
    assert m_one["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert m_one["actor/pg_clipfrac"] == m_sep["actor/pg_clipfrac"] == 0.0
    # half the tokens sit 1 nat below the rollout's (w = e^-1 = 0.37), half above
    # (w = e = 2.72 -> capped at 2): the importance weights are in play
    assert 0.3 < m_one["rollout/is_capped_frac"] < 0.7
    for key in ("rollout/is_weight_mean", "rollout/is_capped_frac"):
        assert m_one[key] == pytest.approx(m_sep[key], abs=1e-6), key
    moved = 0.0
    for name, w in r["w_sep"].items():
        torch.testing.assert_close(r["w_one"][name], w, rtol=0, atol=1e-6, msg=name)
        moved = max(moved, (w - r["initial"][name]).abs().max().item())
    # Adam's first step moves a trained weight by ~lr: the comparison is not vacuous
    assert moved > 0.5 * LR
    # the returned log-probs are what the separate forward gave (0 off the response)
    torch.testing.assert_close(r["logp"], r["old"], rtol=0, atol=1e-6)
    assert r["logp"].abs().sum() > 0


def test_dropout_is_detected(results):
    # LoRA dropout 0.1 makes a training forward random; the micro model has none
    assert results["has_dropout"] == (True, False)
