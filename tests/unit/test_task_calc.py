"""The calc task: split, rewards, the solved chats, the multiply tool and its config."""

from __future__ import annotations

import asyncio

import pytest

from rlpost.config.compose import compose
from rlpost.data.tasks import TASKS, build_task
from rlpost.data.tasks.calc import CalcTask, correctness, format_reward, reward, tool_call_text
from rlpost.models.warmup import warmup_key
from rlpost.plan.inputs import load_data
from rlpost.rewards.loading import load_reward_fn
from rlpost.rollout.agent.env import ToolEnv
from rlpost.rollout.agent.loop import assistant_message
from rlpost.rollout.agent.parsers import parse_hermes


def test_split_deterministic_disjoint_and_complete():
    task = CalcTask(seed=3, min_operand=10, max_operand=19, num_val=20)
    train, val = task.train_rows(), task.val_rows()
    assert (len(train), len(val)) == (80, 20)  # 10 * 10 ordered pairs
    prompts = lambda rows: [r["prompt"] for r in rows]  # noqa: E731
    assert not set(prompts(train)) & set(prompts(val))
    assert set(prompts(train)) | set(prompts(val)) == {
        f"{a}*{b}=" for a in range(10, 20) for b in range(10, 20)
    }
    assert train == CalcTask(seed=3, min_operand=10, max_operand=19, num_val=20).train_rows()
    assert prompts(CalcTask(seed=4, min_operand=10, max_operand=19, num_val=20).val_rows()) != (
        prompts(val)
    )


def test_rows_default_range_and_validation():
    rows = CalcTask().train_rows()
    assert len(rows) == 90 * 90 - 200  # two-digit operands 10..99
    assert rows[0].keys() == {"prompt", "answer", "data_source"}
    for row in rows[:50]:
        a, b = row["prompt"].rstrip("=").split("*")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert row["answer"] == str(int(a) * int(b)) and row["data_source"] == "calc"
    assert TASKS["calc"] is CalcTask
    assert build_task("calc", seed=1, max_operand=20, num_val=5).val_rows()[0]["data_source"] == (
        "calc"
    )
    with pytest.raises(ValueError, match=r"num_val must be in \[0, 4\)"):
        CalcTask(min_operand=10, max_operand=11, num_val=4)
    with pytest.raises(ValueError, match="min_operand <= max_operand"):
        CalcTask(min_operand=10, max_operand=9)


ROW = {"prompt": "37*58=", "answer": "2146"}  # 37 * 58 = 2146


@pytest.mark.parametrize(
    ("completion", "correct", "fmt"),
    [
        ("2146", 1.0, 1.0),
        (" 2146\n", 1.0, 1.0),
        ("2146<|end|>", 1.0, 1.0),
        ("2146<|tool|>junk", 1.0, 1.0),  # only the text before a special token counts
        ("2164", 0.0, 1.0),
        ("02146", 0.0, 1.0),
        ("37*58=2146", 0.0, 0.0),
        ("2,146", 0.0, 0.0),
        ("", 0.0, 0.0),  # an episode that ended on its tool call has no answer
        ('<tool_call>{"name":"multiply","arguments":{"a":37,"b":58}}</tool_call>', 0.0, 0.0),
    ],
)
def test_rewards_hand_values(completion, correct, fmt):
    assert correctness(completion, ROW) == correct
    assert format_reward(completion, ROW) == fmt
    assert reward(completion, ROW) == {"correctness": correct, "format": fmt}
    assert reward.default_weights == {"correctness": 1.0, "format": 0.0}  # type: ignore[attr-defined]


def test_sft_chat_is_a_parsable_call_then_the_copied_result():
    row = CalcTask(seed=0).sft_rows()[0]
    a, b = (int(x) for x in row["prompt"].rstrip("=").split("*"))
    user, call, tool, answer = row["messages"]
    assert user == {"role": "user", "content": row["prompt"]}
    # every character is one the model must emit: no spaces in the JSON
    assert (
        call["content"]
        == f'<tool_call>{{"name":"multiply","arguments":{{"a":{a},"b":{b}}}}}</tool_call>'
    )
    assert len(tool_call_text(37, 58)) == 70  # 11 + 47 + 12 characters
    parsed = parse_hermes(call["content"])
    assert (parsed.content, parsed.errors) == ("", [])
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("multiply", {"a": a, "b": b})]
    # the tool environment's own reply to that call is the chat's tool turn
    replies, done, _ = asyncio.run(ToolEnv(["multiply"]).step(assistant_message(parsed)))
    assert replies == [tool] and not done
    assert answer == {"role": "assistant", "content": row["answer"]}
    assert reward(answer["content"], row)["correctness"] == 1.0


def test_agent_calculator_config_sets_the_task():
    cfg = compose(["agent=calculator"])
    assert cfg.agent.enabled and cfg.agent.tools == ["multiply"]
    assert (cfg.data.name, cfg.reward.fn) == ("calc", "calc")
    assert load_reward_fn(cfg.reward.fn) is reward
    # one model turn holds the whole call and its end token
    assert cfg.agent.max_turn_tokens >= len(tool_call_text(99, 99)) + 1
    # user prompt (9 tokens with the template) + call + tool reply + answer fit the budget
    assert cfg.agent.max_response_tokens >= 71 + len("<|tool|>9801") + 2 + 5
    train, val, bad = load_data(cfg)
    assert train[0]["data_source"] == "calc" and len(val) == cfg.data.val_size and bad == 0
    # later overrides still win over the preset's global values
    cfg = compose(["agent=calculator", "data.prompts_per_step=8", "agent.max_turns=2"])
    assert (cfg.data.prompts_per_step, cfg.agent.max_turns) == (8, 2)
    # the warm-up is cached per task
    assert warmup_key(compose(["agent=calculator"])) != warmup_key(
        compose(["agent=calculator", "data.name=arith", "reward.fn=arith"])
    )
