"""Weight sync through Ray: after an update and a sync, the vLLM replica's
sampling log-probs equal the FSDP trainer's on the same tokens."""

from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")
pytest.importorskip("vllm")

from algos import PolicyLossConfig  # noqa: E402
from rlpost.controller import logprob_parity  # noqa: E402
from rlpost.samples import encode_prompt, rollout_batch  # noqa: E402
from rlpost.tiny import build_tiny_model  # noqa: E402
from rlpost.workers.rollout_worker import RolloutWorker  # noqa: E402
from rlpost.workers.trainer_worker import TrainerGroup  # noqa: E402
from rollout.base import GenerationRequest, SamplingConfig  # noqa: E402
from rollout.vllm import VLLMEngineConfig  # noqa: E402
from trainers.fsdp import FSDPEngineConfig  # noqa: E402

PROMPTS = ["12+7=", "3+45=", "60+9=", "0+0="]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_rollout_logprobs_match_trainer_after_sync(cluster, tmp_path):
    from transformers import AutoTokenizer

    # init_std 0.3 makes the untrained model's samples vary (at 0.02 it repeats a token).
    path = str(build_tiny_model("micro", tmp_path / "m", seed=0, init_std=0.3))
    tokenizer = AutoTokenizer.from_pretrained(path)
    trainer = TrainerGroup(
        FSDPEngineConfig(model_path=path, lr=5e-2, micro_batch_size=8), 1, 1.0, 1, {}
    )
    actor = ray.remote(num_cpus=1)(RolloutWorker)
    rollout = actor.remote(VLLMEngineConfig(model_path=path, kv_cache_gib=0.0625), 1)
    sampling = SamplingConfig(n=4, temperature=1.0, max_tokens=6, seed=0)
    requests = [
        GenerationRequest(encode_prompt(tokenizer, {"prompt": p}), sampling) for p in PROMPTS
    ]

    def sample_and_compare():
        results = ray.get(rollout.generate.remote(requests))
        batch = rollout_batch(results, tokenizer.pad_token_id)
        batch.old_logp_bt = trainer.logprobs(batch, temperature=1.0)
        return batch, logprob_parity(batch)

    # Same initial weights on both sides.
    batch, parity = sample_and_compare()
    assert parity["rollout/logprob_abs_diff_max"] < 1e-3

    # One large update on the trainer only: the replica is now stale, and the
    # comparison must show it (so the check below can fail).
    torch.manual_seed(0)
    batch.advantages_bt = torch.randn(len(batch), 1) * batch.response_mask_bt
    trainer.update_policy(batch, loss_cfg=PolicyLossConfig())
    _, stale = sample_and_compare()
    assert stale["rollout/logprob_abs_diff_max"] > 1e-2

    # After the sync the replica samples from the trainer's weights.
    ray.get(rollout.load_weights.remote(trainer.weights_ref()))
    _, synced = sample_and_compare()
    assert synced["rollout/logprob_abs_diff_max"] < 1e-3
    assert synced["rollout/logprob_abs_diff_mean"] < 1e-4
    trainer.close()
    ray.kill(rollout)
