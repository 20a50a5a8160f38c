"""The samples page: filters, pairing by prompt, chat roles, and escaping."""

from __future__ import annotations

from rlpost.board.samples import keep, message_kind, pair_by_prompt
from rlpost.board.samples_page import sample_card


def _s(prompt: str, total: float | None, finish: str = "stop") -> dict:
    rewards = {} if total is None else {"total": total}
    return {"prompt": prompt, "completion": "x", "rewards": rewards, "finish_reason": finish}


def test_filter_by_reward_bounds_and_finish_reason():
    samples = [_s("a", 0.0), _s("a", 0.5, "length"), _s("b", 1.0), _s("c", None)]
    assert keep(samples) == samples
    assert keep(samples, min_reward=0.5) == samples[1:3]
    assert keep(samples, max_reward=0.5) == samples[:2]
    assert keep(samples, finish="length") == [samples[1]]


def test_two_steps_are_paired_by_prompt():
    left, right = [_s("a", 0.0), _s("b", 1.0)], [_s("b", 0.0), _s("c", 1.0)]
    pairs = [(p, len(x), len(y)) for p, x, y in pair_by_prompt(left, right)]
    assert pairs == [("a", 1, 0), ("b", 1, 1), ("c", 0, 1)]


def test_chat_roles_prompt_model_tool_and_environment():
    messages = [
        {"role": "system", "content": "s"}, {"role": "user", "content": "56*21="},
        {"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": "1176"},
        {"role": "user", "content": "try again"},
    ]  # fmt: skip
    kinds = [message_kind(messages, i) for i in range(len(messages))]
    assert kinds == ["system", "prompt", "model", "tool", "env"]


def test_model_text_is_escaped():
    evil = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    card = sample_card({**_s(evil, 1.0), "completion": evil, "rewards": {evil: 1.0}})
    assert "<script>" not in card and "<img" not in card
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in card
    chat = sample_card(
        {
            "prompt": "p",
            "rewards": {"total": 0.0},
            "messages": [
                {"role": "user", "content": "p"},
                {"role": "assistant", "content": evil, "tool_calls": [
                    {"function": {"name": evil, "arguments": {"a": evil}}}]},
            ],
        }
    )  # fmt: skip
    assert "<script>" not in chat and "<img" not in chat
