"""The discriminative reward model: batched scores against a direct forward,
the checks of its folder, and failures counted."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlpost.models.tiny import build_tiny_model, build_tiny_reward_model
from rlpost.rewards.combine import RewardSet
from rlpost.rewards.loading import RewardError, load_reward_fn
from rlpost.rewards.reward_model import (
    ModelReward,
    SequenceRewardModel,
    chat_of,
    check_reward_model,
)

CHATS = [
    chat_of("12+7=", "19"),
    chat_of([{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1="}], "2"),
    chat_of("3+4=", "a much longer completion than the others"),
    chat_of("9+9=", ""),
    chat_of(
        "x",
        "y",
        messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "yz"}],
    ),
]


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return build_tiny_reward_model("micro", tmp_path_factory.mktemp("rm") / "rm", seed=0)


def test_batched_scores_match_a_direct_forward_of_each_chat(rm_path):
    model = SequenceRewardModel(str(rm_path), batch_size=2)
    scores = model.score(CHATS)
    tokenizer = AutoTokenizer.from_pretrained(rm_path)
    reference = AutoModelForSequenceClassification.from_pretrained(rm_path).eval()
    direct = []
    for chat in CHATS:
        ids = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            direct.append(float(reference(input_ids=torch.tensor([ids])).logits[0, 0]))
    # batches of 2 padded to the longest chat, against one unpadded chat at a time
    assert scores == pytest.approx(direct, abs=1e-5)
    assert len(set(round(s, 6) for s in scores)) == len(CHATS)  # a random head tells them apart
    assert CHATS[4][-1]["content"] == "yz"  # an episode's own messages are what is scored


def test_a_folder_without_a_head_or_a_template_is_named(tmp_path, rm_path):
    lm = build_tiny_model("micro", tmp_path / "lm", seed=0)
    [problem] = check_reward_model(str(lm))
    assert "no classification head" in problem and "Qwen2ForCausalLM" in problem
    assert check_reward_model(str(rm_path)) == []
    assert "no config.json" in check_reward_model(str(tmp_path / "nowhere"))[0]
    config = json.loads((rm_path / "config.json").read_text())
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "config.json").write_text(
        json.dumps({**config, "id2label": {"0": "a", "1": "b"}})
    )
    problems = check_reward_model(str(tmp_path / "two"))
    assert any("2 labels" in p for p in problems) and any("chat template" in p for p in problems)


def test_model_scores_join_rule_rewards_by_weight_and_failures_count(rm_path):
    model = SequenceRewardModel(str(rm_path))
    row = {"prompt": "12+7=", "answer": "19"}
    rm = ModelReward("rm", model.score, max_error_frac=1.0)
    rewards = RewardSet.of_functions(["arith"], [load_reward_fn("arith")], {"rm": 0.5})
    rewards.names.append("rm")
    rewards.scorers.append(rm)
    scores, metrics = rewards.score(["19", "18"], [row, row])
    rm_scores = model.score([chat_of("12+7=", "19"), chat_of("12+7=", "18")])
    assert scores["rm"] == pytest.approx(rm_scores)
    # total = correctness + 0 x format + 0.5 x rm
    assert scores["total"] == pytest.approx([1 + 0.5 * rm_scores[0], 0.5 * rm_scores[1]])
    assert metrics["reward/rm/errors"] == 0.0

    def broken(chats):
        raise RuntimeError("the worker died")

    failing = ModelReward("rm", broken, max_error_frac=1.0)
    scores, metrics = failing.score(["19", "18"], [row, row])
    assert scores["rm"] == [0.0, 0.0] and metrics["reward/errors"] == 2.0
    with pytest.raises(RewardError, match="failed on all 2 samples"):
        ModelReward("rm", broken, max_error_frac=0.5).score(["19", "18"], [row, row])
