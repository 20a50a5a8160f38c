"""Prefix-shared micro-batches (``trainer.prefix_sharing``) give the unshared paths'
log-probs, gradients, metrics and critic values: the samples of a prompt and the
segments of an agent episode run their common prefix once, through an attention
mask, on the real FSDP2 engine and a tiny Qwen2 model.

Shapes: b = samples, t = tokens.
"""

from __future__ import annotations

import pytest
import torch
from engine_utils import advantages, assert_same_update, engine, free_port, full_grads, spawn

from rlpost.algos import PolicyLossConfig
from rlpost.models.tiny import build_tiny_model
from rlpost.trainers.batch import TrajectoryBatch, pad_sequences
from rlpost.trainers.fsdp.engine import FSDPEngineConfig, RegularizerConfig
from rlpost.trainers.fsdp.lora import LoraSettings
from rlpost.trainers.micro_batching import row_lengths
from rlpost.trainers.prefix_sharing import share_prefixes

# name -> engine settings; the unshared reference of each is REFERENCE[name]
VARIANTS = {
    "padded": dict(micro_batch_size=16),
    "shared": dict(micro_batch_size=16, prefix_sharing="on"),
    "shared_micro": dict(micro_batch_size=4, prefix_sharing="on"),
    "shared_auto_ckpt": dict(
        micro_batch_size=16, prefix_sharing="auto", gradient_checkpointing=True
    ),
    "lora_padded": dict(micro_batch_size=16, lora=LoraSettings(rank=4)),
    "lora_shared": dict(micro_batch_size=16, prefix_sharing="on", lora=LoraSettings(rank=4)),
}
REFERENCE = {
    "shared": "padded",
    "shared_micro": "padded",
    "shared_auto_ckpt": "padded",
    "lora_shared": "lora_padded",
}
REG = RegularizerConfig(entropy_coef=0.01)


def grouped_batch(seed: int = 0) -> TrajectoryBatch:
    """Three prompts with three samples each, an agent episode split in two segments
    (the second begins with the whole first), and a prompt of its own."""
    g = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(5, 100, (n,), generator=g).tolist()

    ids, resp = [], []
    for p, responses in ((9, (4, 2, 6)), (6, (5, 5, 1)), (12, (3, 7, 2))):
        prompt = tokens(p)
        for r in responses:
            ids.append(prompt + tokens(r))
            resp.append([0] * p + [1] * r)
    first = tokens(7) + tokens(4)  # prompt 7, answer 4
    ids.append(first)
    resp.append([0] * 7 + [1] * 4)
    ids.append(first + tokens(3) + tokens(5))  # + a tool result 3, answer 5
    resp.append([0] * 7 + [1] * 4 + [0] * 3 + [1] * 5)
    ids.append(tokens(5) + tokens(3))
    resp.append([0] * 5 + [1] * 3)
    return TrajectoryBatch(
        input_ids_bt=pad_sequences(ids, 0),
        attention_mask_bt=pad_sequences([[1] * len(s) for s in ids], 0),
        response_mask_bt=pad_sequences(resp, 0),
    )


def test_samples_that_begin_alike_run_as_one_tree():
    # rows [1 2 3 4 5 6], [1 2 3 4 7], [1 2 3 4 5 6 8 9]: each shares at least half of
    # itself with the row before, so one tree: [1 2 3 4] once, the third continuing
    # the first. [9 9] shares nothing: a tree of its own, padded to the first's width.
    ids = pad_sequences([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7], [1, 2, 3, 4, 5, 6, 8, 9], [9, 9]], 0)
    trees = share_prefixes(ids, [6, 5, 8, 2])
    assert trees.ids_RL.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 9, 0, 0, 0, 0, 0, 0, 0]]
    assert trees.pos_RL.tolist() == [[0, 1, 2, 3, 4, 5, 4, 6, 7], [0, 1, 0, 0, 0, 0, 0, 0, 0]]
    # each packed token (the rows one after the other) and its place: tree x 9 + node
    assert trees.index_T.tolist() == [
        0,
        1,
        2,
        3,
        4,
        5,
        0,
        1,
        2,
        3,
        6,
        0,
        1,
        2,
        3,
        4,
        5,
        7,
        8,
        9,
        10,
    ]
    assert trees.tree_tokens == 11 and trees.saved == pytest.approx(1 - 11 / 21)
    assert trees.size == 18  # what the forward runs, padding included
    allowed = trees.allowed_RLL
    # the third row's last token sees its own row (nodes 0-5, 7, 8), not the second
    # row's 7 (node 6)
    assert allowed[0, 8].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5, 7, 8]
    assert allowed[0, 6].nonzero().flatten().tolist() == [0, 1, 2, 3, 6]
    assert allowed[0, 3].nonzero().flatten().tolist() == [0, 1, 2, 3]  # the prefix: causal
    assert allowed[1, 1].nonzero().flatten().tolist() == [0, 1]  # the lone row: its own
    assert allowed[1, 5].nonzero().flatten().tolist() == [5]  # padding: itself
    # rows that share less than half of themselves are trees of their own
    two = share_prefixes(pad_sequences([[1, 2, 3, 5, 6, 7, 8], [1, 2, 3, 6, 6, 7, 8]], 0), [7, 7])
    assert two.ids_RL.shape == (2, 7) and two.saved == 0.0


def test_the_test_batch_shares_most_of_its_tokens():
    batch = grouped_batch()
    assert share_prefixes(batch.input_ids_bt, row_lengths(batch)).saved > 0.3


def _worker(rank: int, model_dir: str, port: int, out: str) -> None:
    """Every variant in one process: log-probs and one update's gradients, then the
    critic's values and one update, shared and not."""
    from rlpost.trainers.fsdp.critic import CriticEngine

    results: dict = {}
    for name, kw in VARIANTS.items():
        eng = engine(model_dir, rank, 1, port, lr=1e-4, **kw)
        for n, p in eng.model.named_parameters():  # B = 0 would give lora_A no gradient
            if ".lora_B." in n:
                with torch.no_grad():
                    p.fill_(0.01)
        batch = grouped_batch()
        batch.advantages_bt = advantages(batch)
        batch.old_logp_bt = eng.logprobs(batch)
        metrics = eng.update_policy(batch, PolicyLossConfig(), reg=REG)
        results[name] = {"logp": batch.old_logp_bt, "grads": full_grads(eng.model), "m": metrics}
        results[name]["run"] = (eng._sharing.tokens_run, eng._sharing.tokens_unshared)
        del eng
    for name, sharing in (("critic", "off"), ("critic_shared", "on")):
        cfg = FSDPEngineConfig(
            model_path=model_dir,
            lr=1e-3,
            lr_warmup_steps=0,
            micro_batch_size=16,
            prefix_sharing=sharing,
        )
        critic = CriticEngine(cfg, rank, 1, f"tcp://127.0.0.1:{port}")
        with torch.no_grad():  # a head that is not zero, so the values differ by token
            critic.model.value_head.weight.normal_(
                0, 0.5, generator=torch.Generator().manual_seed(0)
            )
        batch = grouped_batch()
        batch.returns_bt = torch.randn(
            batch.input_ids_bt.shape, generator=torch.Generator().manual_seed(2)
        )
        batch.old_values_bt = critic.values(batch)
        m = critic.update_critic(batch, value_clip=10.0, agg="token-mean")
        results[name] = {"values": batch.old_values_bt, "grads": full_grads(critic.model), "m": m}
        results[name]["run"] = critic._sharing.tokens_run
        del critic
    torch.save(results, out)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("share")
    model_dir = str(build_tiny_model("micro", root / "m", 0, init_std=0.3))
    out = root / "out.pt"
    spawn(_worker, (model_dir, free_port(), str(out)))
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("variant", list(REFERENCE))
def test_shared_prefixes_give_the_unshared_log_probs_and_gradients(variant, results):
    ref, got = results[REFERENCE[variant]], results[variant]
    mask = grouped_batch().response_mask_bt.bool()
    assert_same_update(got, ref, mask)
    run, unshared = got["run"]  # and the shared rows ran: fewer tokens than unshared
    assert 0 < run < unshared and ref["run"] == (0, 0)


def test_the_critic_shares_prefixes_with_the_same_values_and_gradients(results):
    ref, got = results["critic"], results["critic_shared"]
    mask = grouped_batch().response_mask_bt.bool()
    torch.testing.assert_close(got["values"][mask], ref["values"][mask], rtol=0, atol=1e-5)
    assert ref["values"][mask].std() > 1e-3  # the values differ by token
    for name, g in ref["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-5, atol=1e-6, msg=name)
    assert got["m"]["critic/vf_loss"] == pytest.approx(ref["m"]["critic/vf_loss"], rel=1e-5)
    assert got["run"] > 0 and ref["run"] == 0


RL_PRESETS = [
    "grpo",
    "dapo",
    "dr_grpo",
    "gspo",
    "cispo",
    "sapo",
    "reinforce_pp",
    "rloo",
    "gdpo",
    "ppo",
]


def _presets_worker(rank: int, model_dir: str, port: int, out: str) -> None:
    """Each RL preset's policy loss and regularisers, one update (at lr 0, so both
    engines keep the weights they share) by a padded and a prefix-shared engine."""
    from rlpost.config.compose import compose
    from rlpost.plan.algo import algo_settings

    plain = engine(model_dir, rank, 1, port, lr=0.0, micro_batch_size=16)
    shared = engine(model_dir, rank, 1, port, lr=0.0, micro_batch_size=16, prefix_sharing="on")
    results = {}
    for name in RL_PRESETS:
        settings = algo_settings(compose([f"algo={name}"]))
        got = {}
        for label, eng in (("plain", plain), ("shared", shared)):
            batch = grouped_batch(seed=1)
            batch.advantages_bt = advantages(batch)
            batch.old_logp_bt = eng.logprobs(batch) - 0.05 * batch.response_mask_bt  # ratios != 1
            m = eng.update_policy(batch, settings.loss, reg=settings.reg)
            got[label] = {"m": m, "grads": full_grads(eng.model)}
        results[name] = got
    torch.save(results, out)


def test_every_rl_preset_updates_alike_with_shared_prefixes(tmp_path):
    model_dir = str(build_tiny_model("micro", tmp_path / "m", 0, init_std=0.3))
    out = tmp_path / "presets.pt"
    spawn(_presets_worker, (model_dir, free_port(), str(out)))
    results = torch.load(out, weights_only=False)
    assert set(results) == set(RL_PRESETS)
    for name, got in results.items():
        plain, shared = got["plain"], got["shared"]
        assert plain["m"]["actor/grad_norm"] > 1e-3 and plain["grads"], name
        for key in ("actor/loss", "actor/grad_norm"):
            assert shared["m"][key] == pytest.approx(plain["m"][key], rel=1e-5, abs=1e-7), (
                name,
                key,
            )
        for param, g in plain["grads"].items():
            torch.testing.assert_close(
                shared["grads"][param], g, rtol=1e-5, atol=1e-6, msg=f"{name} {param}"
            )
