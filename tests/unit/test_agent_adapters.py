"""Other libraries' environments behind reset/step: a TRL-style class, skyrl-gym's
gsm8k, a TextArena game and an OpenEnv server, each driven by hand-written
assistant turns; and their config mistakes as EnvErrors that say what to change."""

from __future__ import annotations

import asyncio

import pytest

from rlpost.rollout.agent.env import EnvError, load_env
from tests.openenv_server import number_guess_server

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


# -- OpenEnv: examples/agents/openenv_number_guess.py served by openenv's own app ------
GUESS = "examples/agents/openenv_number_guess.py"  # served by tests/openenv_server.py
CLIENT = f"openenv:{GUESS}:NumberGuessEnv"
OPENING = "I picked a number between 1 and 20. You have 3 guesses."


@pytest.fixture(scope="module")
def guess_url():
    """One session at a time: a session an episode does not give back blocks the next."""
    pytest.importorskip("openenv.core")
    with number_guess_server(max_sessions=1) as (url, _):
        yield url


def test_openenv_server_plays_a_seeded_game_to_its_summed_reward(guess_url):
    make = load_env(f"openenv:{guess_url}")

    async def play() -> list:
        env = make()
        opening = await env.reset({"prompt": "Play.", "seed": 3})  # secret 1 + 3 % 20 = 4
        # the reset's observation text goes after the prompt in the last user message
        assert opening == [{"role": "user", "content": f"Play.\n\n{OPENING}"}]
        out = [await env.step(answer("10"))]  # -0.1
        out.append(await env.step(answer("maybe 99?")))  # the env's step raises: no guess used
        out.append(await env.step(answer("no idea")))  # no reward: counts 0
        out.append(await env.step(answer("It is 4")))  # 1.0, done
        assert [o.status for o in env.outcomes] == ["error"]
        return out

    lower, refused, no_number, correct = asyncio.run(play())
    assert lower == ([{"role": "user", "content": "Lower."}], False, -0.1)
    (error,), done, reward = refused
    assert error["content"].startswith("Error: 99 is not between 1 and 20") and not done
    assert reward == -0.1  # a refused step adds nothing
    assert no_number == ([{"role": "user", "content": "Answer with a number."}], False, -0.1)
    # the episode's reward sums its steps': -0.1 + 0 + 1.0 = 0.9
    assert correct[:2] == ([], True) and correct[2] == pytest.approx(0.9)


def test_openenv_client_class_builds_its_action_with_defaults(guess_url):
    make = load_env(
        CLIENT,
        {"base_url": guess_url, "action_defaults": {"verbose": True}, "reward": "last"},
    )

    async def play() -> list:
        env = make()
        assert env.settings.action_cls.__name__ == "NumberGuessAction"
        await env.reset({"prompt": "Play.", "seed": 17})  # secret 18
        return [await env.step(answer("9")), await env.step(answer("18"))]

    higher, correct = asyncio.run(play())
    # verbose=True from action_defaults: the feedback counts the guesses left (3 - 1)
    assert higher == ([{"role": "user", "content": "Higher. 2 guesses left."}], False, -0.1)
    assert correct == ([], True, 1.0)  # reward=last: the last step's, not -0.1 + 1.0


def test_openenv_sessions_are_given_back_and_waited_for(guess_url):
    row = {"prompt": "Play.", "seed": 0}  # secret 1

    async def run() -> None:
        quick = load_env(f"openenv:{guess_url}", {"session_wait_s": 0.3})
        cut = quick()
        await cut.reset(row)  # an episode cut short (agent.max_turns): never done
        await cut.close()  # as the episode loop does: the server's one slot is free again
        holder = quick()
        await holder.reset(row)
        with pytest.raises(EnvError, match=r"127\.0\.0\.1:\d+: cannot open a session .* limit"):
            await quick().reset(row)
        patient = load_env(f"openenv:{guess_url}", {"session_wait_s": 30})()

        async def finish() -> None:
            await asyncio.sleep(0.5)
            assert (await holder.step(answer("1")))[1]  # done: its session is closed

        await asyncio.gather(finish(), patient.reset(row))  # waits for the holder's slot
        assert (await patient.step(answer("1"))) == ([], True, 1.0)

    asyncio.run(run())


def test_openenv_a_lost_server_ends_the_episode_counted():
    pytest.importorskip("openenv.core")

    async def run(url: str, proc) -> tuple:
        env = load_env(f"openenv:{url}")()
        await env.reset({"prompt": "Play.", "seed": 3})
        first = await env.step(answer("10"))
        proc.kill()
        proc.wait(timeout=30)
        return first, await env.step(answer("4")), env.outcomes

    with number_guess_server(max_sessions=1) as (url, proc):
        first, lost, outcomes = asyncio.run(run(url, proc))
    assert first[1:] == (False, -0.1)
    assert lost == ([], True, -0.1)  # what the episode had earned
    assert [o.status for o in outcomes] == ["error"]
    with pytest.raises(EnvError, match=f"schema at {url}/schema .*start the server"):
        load_env(f"openenv:{url}")


def test_openenv_mistakes_say_what_to_change(guess_url, monkeypatch):
    from rlpost.rollout.agent.openenv_adapter import _action_field

    spec = f"openenv:{guess_url}"
    with pytest.raises(EnvError, match=r"action_field=move: NumberGuessAction has fields guess"):
        load_env(spec, {"action_field": "move"})
    with pytest.raises(EnvError, match=r"action_defaults: NumberGuessAction has no fields \['x'\]"):
        load_env(spec, {"action_defaults": {"x": 1}})
    with pytest.raises(
        EnvError, match=r"observation_field=text: .* \['feedback', 'guesses_left'\]"
    ):
        load_env(spec, {"observation_field": "text"})
    with pytest.raises(EnvError, match=r"takes base_url, .* not \['colour'\].*reward=all"):
        load_env(spec, {"colour": 1, "reward": "all"})
    with pytest.raises(EnvError, match="base_url: the spec already names the server"):
        load_env(spec, {"base_url": guess_url})
    with pytest.raises(EnvError, match="base_url=None: the client class needs the server's URL"):
        load_env(CLIENT)
    with pytest.raises(EnvError, match="NumberGuessEnvironment is the server side"):
        load_env(f"openenv:{GUESS}:NumberGuessEnvironment", {"base_url": guess_url})
    # two text fields: which one the model writes is the user's to say
    problems: list[str] = []
    schema = {"title": "Move", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
    assert _action_field(schema, None, {}, problems) == ""
    assert (
        "name the one that gets the model's text with agent.env_kwargs.action_field" in problems[0]
    )
    assert _action_field({**schema, "required": ["a", "b"]}, "a", {}, problems[1:]) == "a"
    monkeypatch.setitem(__import__("sys").modules, "openenv.core", None)
    with pytest.raises(EnvError, match=r"needs the openenv-core package .*rlpost\[openenv\]"):
        load_env(spec)
