"""Other libraries' environments behind reset/step: a TRL-style class, skyrl-gym's
gsm8k and a TextArena game, each driven by hand-written assistant turns; and their
config mistakes as EnvErrors that say what to change."""

from __future__ import annotations

import asyncio

import pytest
from rlpost.rollout.agent.env import EnvError, load_env

COUNTER = "examples/agents/trl_style_env.py:CounterEnv"


def call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": "", "text": "<tool_call>...</tool_call>",
            "tool_calls": [{"id": "call_0", "type": "function",
                            "function": {"name": name, "arguments": arguments}}]}  # fmt: skip


def answer(text: str) -> dict:
    return {"role": "assistant", "content": text, "text": text}


def test_a_trl_style_class_has_its_methods_as_tools_and_its_reward_attribute():
    env = load_env(COUNTER)()
    assert [t["function"]["name"] for t in env.tool_schemas] == ["increment"]
    messages = env.reset({"prompt": "Count to 5.", "target": 5, "other": "ignored"})
    # reset's string goes after the prompt in the last user message
    assert messages == [{"role": "user", "content": "Count to 5.\n\nThe counter starts at 0."}]
    replies, done, reward = asyncio.run(env.step(call("increment", by=2)))
    assert replies[0]["content"] == "2" and not done and reward is None
    asyncio.run(env.step(call("increment", by=3)))  # the state carries over: 2 + 3
    assert asyncio.run(env.step(answer("done"))) == ([], True, 1.0)
    fresh = load_env(COUNTER)()  # one instance per episode
    fresh.reset({"prompt": "Count to 1.", "target": 1})
    assert asyncio.run(fresh.step(answer("done"))) == ([], True, 0.0)


def test_a_trl_style_method_without_a_docstring_is_named(tmp_path):
    path = tmp_path / "envs.py"
    path.write_text(
        "class Bad:\n    def reset(self):\n        pass\n    def poke(self, x: int) -> int:\n        return x\n"
    )
    with pytest.raises(EnvError, match=r"Bad.poke: poke has no docstring"):
        load_env(f"{path}:Bad")


def test_skyrl_gym_gsm8k_scores_with_the_rows_reward_spec():
    pytest.importorskip("skyrl_gym")
    make = load_env("skyrl_gym:gsm8k")
    row = {"prompt": "What is 6*7?", "reward_spec": {"method": "rule", "ground_truth": "42"}}
    env = make()
    assert env.reset(row) == [{"role": "user", "content": "What is 6*7?"}]
    # skyrl-gym reads the turn's whole text: "#### 42" is gsm8k's answer format
    assert env.step(answer("6*7 is #### 42")) == ([], True, 1.0)
    env = make()
    env.reset(row)
    assert env.step(answer("#### 41"))[1:] == (True, 0.0)


def test_textarena_plays_a_seeded_game_to_its_reward():
    pytest.importorskip("textarena")
    make = load_env("textarena:GuessTheNumber-v0")
    env = make()
    (opening,) = env.reset({"prompt": "play", "seed": 3})
    assert "Guess The Number" in opening["content"]
    same = make()
    assert same.reset({"prompt": "play", "seed": 3}) == [opening]  # a row's episodes: one game
    # find the number by bisection over [1, 20]: each turn's message is the game's new text
    lo, hi, done, reward, turns = 1, 20, False, None, 0
    while not done:
        guess = (lo + hi) // 2
        replies, done, reward = env.step(answer(f"My guess: [{guess}]"))
        turns += 1
        if not done:
            text = replies[0]["content"]
            assert "Guess The Number" not in text  # only what the game added
            lo, hi = (guess + 1, hi) if "higher" in text else (lo, guess - 1)
    assert reward == 1.0 and turns <= 5  # ceil(log2(20)) guesses


def test_library_mistakes_say_what_to_change():
    pytest.importorskip("skyrl_gym")
    pytest.importorskip("textarena")
    with pytest.raises(EnvError, match="skyrl-gym has no environment 'gsm9k'; did you mean gsm8k"):
        load_env("skyrl_gym:gsm9k")
    with pytest.raises(EnvError, match="TextArena has no environment 'GuessTheNumbr-v0'"):
        load_env("textarena:GuessTheNumbr-v0")
    with pytest.raises(EnvError, match="takes env_config and extras .* not \\['colour'\\]"):
        load_env("skyrl_gym:gsm8k", {"colour": 1})
