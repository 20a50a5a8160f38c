"""PPO critic engine and the KL / entropy regularisers of the policy engine (FSDP2; gloo
on the CPU, NCCL on one CUDA GPU under the ``gpu`` marker).

Shapes: b = samples, t = tokens.

Each engine runs in a fresh process (one default process group per process)
and returns its results through a file.
"""

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from engine_utils import DEVICES, free_port, full_state, make_batch, on

from rlpost.algos import LossNorm, PolicyLossConfig, aggregate, kl_penalty
from rlpost.models.tiny import build_tiny_model
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.fsdp.critic import CriticEngine
from rlpost.trainers.fsdp.engine import FSDPEngine, FSDPEngineConfig, RegularizerConfig

LENGTHS = [(3, 4), (5, 2), (2, 5), (4, 3)]
PRELOAD = [
    "torch.distributed.fsdp",
    "rlpost.models.tiny",
    "rlpost.trainers.fsdp.engine",
    "rlpost.trainers.fsdp.critic",
]


def _port() -> int:
    return free_port()


def _batch() -> TrajectoryBatch:
    return make_batch(0, LENGTHS)


def _spawn(fn, args):
    mp.set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=1, join=True, start_method="forkserver")


def _critic_worker(rank, model_dir, port, out, device):
    cfg = FSDPEngineConfig(
        model_path=model_dir, lr=1e-2, lr_warmup_steps=0, micro_batch_size=3, **on(device)
    )
    critic = CriticEngine(cfg, 0, 1, f"tcp://127.0.0.1:{port}")
    batch = _batch()
    initial = critic.values(batch)
    # Regress onto fixed per-token returns: 1.0 on the first sample's tokens, -1.0 elsewhere.
    returns = (
        torch.where(torch.arange(len(batch))[:, None] == 0, 1.0, -1.0) * batch.response_mask_bt
    )
    losses = []
    for _ in range(30):
        batch.old_values_bt = critic.values(batch)
        batch.returns_bt = returns
        metrics = critic.update_critic(batch, value_clip=10.0, agg="token-mean")
        losses.append(metrics["critic/vf_loss"])
    state = full_state(critic.model)
    torch.save(
        {"initial": initial, "losses": losses, "final": critic.values(batch), "state": state,
         "returns": returns, "explained": metrics["critic/vf_explained_var"]},
        out,
    )  # fmt: skip
    critic.close()


@pytest.mark.parametrize("device", DEVICES)
def test_critic_values_align_and_fit_returns(device, tmp_path):
    model_dir = str(build_tiny_model("micro", tmp_path / "m", seed=0))
    out = tmp_path / "out.pt"
    _spawn(_critic_worker, (model_dir, _port(), str(out), device))
    r = torch.load(out)
    # The value head starts at zero, so every initial value is 0.
    assert torch.equal(r["initial"], torch.zeros_like(r["initial"]))
    # values[:, t] is the head on the hidden state of position t-1: rebuild the
    # trained critic without FSDP and apply the head by hand.
    from transformers import AutoModel

    from rlpost.trainers.fsdp.critic import ValueModel

    body = AutoModel.from_pretrained(model_dir)
    plain = ValueModel(body, body.config.hidden_size)
    plain.load_state_dict(r["state"])
    batch = _batch()
    with torch.no_grad():
        h = body(input_ids=batch.input_ids_bt, attention_mask=batch.attention_mask_bt)
        h = h.last_hidden_state
        manual = F.pad(plain.value_head(h).squeeze(-1)[:, :-1], (1, 0)) * batch.response_mask_bt
    torch.testing.assert_close(r["final"], manual, atol=1e-5, rtol=1e-5)
    # 0.5 * (0 - (+-1))^2 = 0.5 at the start; the regression drives it well below.
    assert r["losses"][0] == pytest.approx(0.5, abs=1e-6)
    assert r["losses"][-1] < 0.1 * r["losses"][0]
    assert r["explained"] > 0.5


def _kl_worker(rank, model_dir, port, out, device):
    init = f"tcp://127.0.0.1:{port}"
    cfg = FSDPEngineConfig(
        model_path=model_dir, lr=1e-2, lr_warmup_steps=0, micro_batch_size=4, **on(device)
    )
    policy = FSDPEngine(cfg, 0, 1, init)
    ref = FSDPEngine(
        FSDPEngineConfig(
            model_path=model_dir,
            lr=0.0,
            lr_warmup_steps=0,
            micro_batch_size=4,
            trainable=False,
            **on(device),
        ),
        0,
        1,
        init,
    )
    batch = _batch()
    batch.ref_logp_bt = ref.logprobs(batch)
    batch.old_logp_bt = policy.logprobs(batch)
    batch.advantages_bt = torch.ones(len(batch), 1) * batch.response_mask_bt
    reg = RegularizerConfig(kl_coef=0.5, kl_type="k3", entropy_coef=0.01)
    first = policy.update_policy(batch, loss_cfg=PolicyLossConfig(), reg=reg)
    moved = policy.logprobs(batch)
    batch.old_logp_bt = moved
    second = policy.update_policy(batch, loss_cfg=PolicyLossConfig(), reg=reg)
    frozen_error = ""
    try:
        ref.update_policy(batch, loss_cfg=PolicyLossConfig())
    except RuntimeError as exc:
        frozen_error = str(exc)
    torch.save(
        {"first": first, "second": second, "moved": moved, "ref": batch.ref_logp_bt,
         "mask": batch.response_mask_bt, "frozen_error": frozen_error,
         "ref_after": ref.logprobs(batch)},
        out,
    )  # fmt: skip
    policy.close()


@pytest.mark.parametrize("device", DEVICES)
def test_kl_loss_against_a_frozen_reference(device, tmp_path):
    model_dir = str(build_tiny_model("micro", tmp_path / "m", seed=0))
    out = tmp_path / "out.pt"
    _spawn(_kl_worker, (model_dir, _port(), str(out), device))
    r = torch.load(out)
    mask = r["mask"].float()
    # Step 1: policy == reference, so k3 = e^0 + 0 - 1 = 0 on every token.
    assert r["first"]["actor/kl"] == pytest.approx(0.0, abs=1e-6)
    assert r["first"]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    # Step 2 starts from the moved policy: the reported KL is the token mean of k3.
    expected = (kl_penalty(r["moved"], r["ref"], "k3") * mask).sum() / mask.sum()
    assert expected > 1e-4
    assert r["second"]["actor/kl"] == pytest.approx(float(expected), rel=1e-4)
    assert r["second"]["actor/kl_loss"] == pytest.approx(float(expected), rel=1e-4)
    # Entropy is reported; the reference neither trains nor changes.
    assert r["first"]["actor/entropy"] > 0
    assert "frozen reference" in r["frozen_error"]
    torch.testing.assert_close(r["ref_after"], r["ref"])


def test_kl_reward_penalty_by_hand():
    from rlpost.algos import kl_reward_penalty

    # two samples, response tokens at t=1..2 and t=1..1; d = logp - ref
    logp = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, 0.0]])
    ref = torch.tensor([[0.0, -1.5, -1.0], [0.0, -1.0, 0.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0]])
    scores = torch.tensor([1.0, 0.0])
    token_r, penalised, kl_b = kl_reward_penalty(scores, logp, ref, mask, coef=0.1, kind="k1")
    # k1: d = [0.5, -1.0] and [0.5]; sums 0.5 - 1.0 = -0.5 and 0.5
    torch.testing.assert_close(kl_b, torch.tensor([-0.5, 0.5]))
    torch.testing.assert_close(penalised, torch.tensor([1.0 + 0.05, 0.0 - 0.05]))
    # score on the last response token, -0.1 * d on every response token
    torch.testing.assert_close(
        token_r, torch.tensor([[0.0, -0.05, 1.0 + 0.1], [0.0, -0.05 + 0.0, 0.0]])
    )
    # The KL loss term, token-mean over the GLOBAL batch: abs gives |d| = 0.5, 1.0 and
    # 0.5 on the 3 response tokens, sum 2.0.
    kl_bt = kl_penalty(logp, ref, "abs")
    # This batch is the whole batch (3 tokens): 2.0 / 3.
    whole = aggregate(kl_bt, mask, "token-mean", LossNorm(global_tokens=3.0, global_samples=2.0))
    assert float(whole) == pytest.approx(2.0 / 3.0)
    # As one of two micro-batches of a 6-token global batch it contributes 2.0 / 6, not
    # its own token mean 2.0 / 3: the divisor is the global count.
    half = aggregate(kl_bt, mask, "token-mean", LossNorm(global_tokens=6.0, global_samples=4.0))
    assert float(half) == pytest.approx(2.0 / 6.0)
