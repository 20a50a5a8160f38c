"""What an episode counts and how it is scored: malformed calls, failing tools and
timeouts reach ``agent/tool_errors`` and ``agent/tool_timeouts``, a cut episode
``agent/truncated``; a turn cut at its token limit counts in ``response/clip_ratio``
and ``agent/turns_cut`` (and ``agent/truncated`` when it ends the episode), and that
limit is ``agent.max_turn_tokens``, not ``rollout.max_tokens``; an environment's
reward wins over ``reward.fn``, which gets the messages when it asks for them; gdpo
refuses environment rewards.

The model turns come from ``ScriptedModel``, a stand-in for the rollout engine
that answers each turn with fixed text: what is tested is the loop above the
engine (the engine itself is tested in tests/integration/test_agent_loop.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from rlpost.config.compose import compose
from rlpost.loop.step_metrics import clip_ratio
from rlpost.models.archs import build_tokenizer
from rlpost.result import RunError
from rlpost.rewards.scoring import RewardScorer
from rlpost.rollout.agent.env import ToolEnv
from rlpost.rollout.agent.loop import AgentLoopConfig, episode_metrics, run_episodes
from rlpost.rollout.agent.tool_pool import ToolWorkerPool
from rlpost.rollout.base import Completion, GenerationResult, SamplingConfig
from rlpost.serving.agent_episodes import AgentRollout, episode_results, score_episodes

TOOLS_PY = '''
import time

def fails(x: int) -> str:
    """Raise."""
    raise RuntimeError("no")

def hangs(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "woke"
'''
SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=400, seed=3)


class ScriptedModel:
    """Stand-in for the rollout engine: answers turn ``k`` of an episode with
    ``turns[k]`` (plus the end token), log-prob -0.5 per token."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tokenizer, self.turns = tokenizer, turns
        self.seen: dict[str, int] = {}

    async def __call__(self, prompt_ids: list[int], sampling: SamplingConfig, session_id: str):
        k = self.seen.get(session_id, 0)
        self.seen[session_id] = k + 1
        ids = self.tokenizer.encode(self.turns[k], add_special_tokens=False)
        ids = (ids + [self.tokenizer.eos_token_id])[: sampling.max_tokens]
        reason = "stop" if ids[-1] == self.tokenizer.eos_token_id else "length"
        return Completion(ids, [-0.5] * len(ids), self.turns[k], reason)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def pool():
    pool = ToolWorkerPool(max_workers=4)
    yield pool
    pool.close()


def _episodes(tokenizer, turns, make_env, config, rows=({"prompt": "go"},), n=1, sampling=SAMPLING):
    model = ScriptedModel(tokenizer, turns)
    return asyncio.run(
        run_episodes(
            list(rows), n, generate=model, tokenizer=tokenizer, make_env=make_env,
            sampling=sampling, config=config, session_prefix="c",
        )
    )  # fmt: skip


def test_failed_malformed_and_timed_out_calls_are_counted(tokenizer, pool, tmp_path: Path):
    tools_py = tmp_path / "t.py"
    tools_py.write_text(TOOLS_PY)
    turns = [
        '<tool_call>{"name": "fails", "arguments": {"x": 1}}</tool_call>'
        '<tool_call>{"name": "hangs", "arguments": {"seconds": 30}}</tool_call>'
        "<tool_call>{not json</tool_call>"
        '<tool_call>{"name": "missing", "arguments": {}}</tool_call>',
        "done",
    ]
    make_env = lambda: ToolEnv([f"{tools_py}:fails", f"{tools_py}:hangs"], 0.5, pool)  # noqa: E731
    config = AgentLoopConfig(max_turns=4, max_response_tokens=2000, max_model_len=4000)
    (ep,) = _episodes(tokenizer, turns, make_env, config)
    assert ep.num_turns == 2 and not ep.truncated
    assert ep.tool_calls == 3  # the well-formed blocks: fails, hangs, missing
    # fails (raised) + missing (unknown tool) + the malformed block
    assert (ep.tool_errors, ep.tool_timeouts) == (3, 1)
    tool_texts = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert len(tool_texts) == 4 and all(t.startswith("Error: ") for t in tool_texts)
    assert ep.final_text == "done"
    m = episode_metrics([ep, ep])
    assert m["agent/tool_calls"] == 6 and m["agent/tool_errors"] == 6
    assert m["agent/tool_timeouts"] == 2 and m["agent/turns_mean"] == 2
    assert m["agent/model_tokens_mean"] == sum(ep.response_mask)
    assert m["agent/env_tokens_mean"] == len(ep.response_mask) - sum(ep.response_mask)


def test_an_episode_cut_by_its_token_budget_is_truncated(tokenizer, pool):
    turn = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'
    make_env = lambda: ToolEnv(["multiply"], 5.0, pool)  # noqa: E731
    roomy = AgentLoopConfig(max_turns=2, max_response_tokens=4000, max_model_len=8000)
    (full,) = _episodes(tokenizer, [turn, turn], make_env, roomy)
    budget = len(full.turns[0].sampled_ids) + 5  # room for the first turn, not its reply
    config = AgentLoopConfig(max_turns=8, max_response_tokens=budget, max_model_len=8000)
    (ep,) = _episodes(tokenizer, [turn] * 8, make_env, config)
    assert ep.truncated and len(ep.response_ids) <= budget
    assert episode_metrics([ep, full])["agent/truncated"] == 1.0  # full: max_turns reached


CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>'


def test_a_turn_cut_at_its_limit_counts_in_clip_ratio(tokenizer, pool):
    make_env = lambda: ToolEnv(["multiply"], 5.0, pool)  # noqa: E731
    config = AgentLoopConfig(max_turns=3, max_response_tokens=4000, max_model_len=8000)
    call_ids = len(tokenizer.encode(CALL, add_special_tokens=False))
    # 16 tokens per turn: the call (65 tokens) is cut inside its JSON, '<tool_call>{"name"',
    # the model hears "unclosed <tool_call>" and answers "42" (2 tokens + end) within it.
    short = dataclasses.replace(SAMPLING, max_tokens=16)
    assert call_ids == 65
    (cut,) = _episodes(tokenizer, [CALL, "42"], make_env, config, sampling=short)
    assert [t.finish_reason for t in cut.turns] == ["length", "stop"]
    assert cut.turns_cut == 1 and cut.tool_errors == 1 and not cut.truncated
    # the episode went on and ended well: "stop" to DAPO's filter, yet clipped
    (result,) = episode_results([cut], 1)
    assert result.completions[0].finish_reason == "stop"
    assert clip_ratio([result]) == 1.0
    # the same episode with room for the call: no cut turn
    (whole,) = _episodes(tokenizer, [CALL, "42"], make_env, config)
    assert whole.turns_cut == 0 and whole.tool_calls == 1
    results = episode_results([cut, whole], 2)
    assert clip_ratio(results) == 0.5  # 1 of 2 episodes had a cut turn
    m = episode_metrics([cut, whole])
    assert m["agent/turns_cut"] == 1.0 and m["agent/truncated"] == 0.0


def test_an_episode_that_ends_on_a_cut_turn_is_truncated(tokenizer, pool):
    make_env = lambda: ToolEnv(["multiply"], 5.0, pool)  # noqa: E731
    config = AgentLoopConfig(max_turns=3, max_response_tokens=4000, max_model_len=8000)
    answer = "the product of six and seven is forty-two"
    # no tool call in the cut text: ToolEnv takes it as the final answer, done
    short = dataclasses.replace(SAMPLING, max_tokens=4)
    (ep,) = _episodes(tokenizer, [answer], make_env, config, sampling=short)
    assert ep.num_turns == 1 and ep.turns[0].finish_reason == "length" and ep.truncated
    (result,) = episode_results([ep], 1)
    assert result.completions[0].finish_reason == "length" and clip_ratio([result]) == 1.0
    assert episode_metrics([ep])["agent/truncated"] == 1.0


class RecordingGroup:
    """A rollout group that answers every request with ``CALL`` then "42", cut to
    the request's ``max_tokens``, and records those limits."""

    def __init__(self, tokenizer):
        self.model = ScriptedModel(tokenizer, [CALL, "42"])
        self.max_tokens: list[int] = []

    async def agenerate(self, request):
        self.max_tokens.append(request.sampling.max_tokens)
        c = await self.model(request.prompt_ids, request.sampling, request.session_id)
        return GenerationResult(request.prompt_ids, [c])


@pytest.mark.parametrize(
    "overrides, first_turn",
    [
        ([], 192),  # agent.max_response_tokens: what the episode's budget leaves
        (["agent.max_turn_tokens=80"], 80),
        (["agent.max_turn_tokens=8"], 8),  # cuts the call to "<tool_call": no call, done
    ],
)
def test_a_turn_is_limited_by_agent_max_turn_tokens_not_rollout_max_tokens(
    tokenizer, overrides, first_turn
):
    cfg = compose(["trainer.device=cpu", "algo=grpo", "agent.tools=[multiply]", *overrides])
    assert cfg.rollout.max_tokens == 8  # the single-turn default, too short for a call
    group = RecordingGroup(tokenizer)
    agent = AgentRollout(cfg, group, tokenizer)
    sampling = dataclasses.replace(SAMPLING, n=1, max_tokens=cfg.rollout.max_tokens)
    (result,) = agent.launch([{"prompt": "6*7="}], sampling).result()
    ep = result.completions[0].episode
    assert group.max_tokens[0] == first_turn
    assert ep.turns_cut == (first_turn == 8) and ep.tool_calls == (first_turn > 8)
    assert clip_ratio([result]) == float(first_turn == 8)


class RewardsOddTurns:
    """Rewards row ``i`` with ``i`` when ``i`` is odd, else gives no reward."""

    def reset(self, row: dict) -> list[dict]:
        self.i = row["i"]
        return [{"role": "user", "content": f"row {row['i']}"}]

    def step(self, message: dict):
        return [], True, (float(self.i) if self.i % 2 else None)


def score(completion: str, i: int, messages: list[dict]) -> dict[str, float]:
    """Named rewards from the answer, the row's column and the whole chat."""
    return {"row": float(i) * 10, "chat": float(len(messages))}


def test_environment_rewards_win_and_reward_fn_sees_the_messages(tokenizer):
    rows = [{"i": i} for i in range(4)]
    config = AgentLoopConfig(max_turns=1, max_response_tokens=100, max_model_len=1000)
    episodes = _episodes(tokenizer, ["answer"], RewardsOddTurns, config, rows=rows)
    results = episode_results(episodes, 1)
    scorer = RewardScorer(score, {"row": 1.0, "chat": 0.5})
    scores, metrics = score_episodes(scorer, results, rows)
    # rows 1 and 3: the environment's reward; rows 0 and 2: reward.fn with 2 messages
    assert scores["total"].tolist() == [0.0 + 1.0, 1.0, 20.0 + 1.0, 3.0]
    assert scores["row"].tolist() == [0.0, 0.0, 20.0, 0.0]
    assert scores["chat"].tolist() == [2.0, 0.0, 2.0, 0.0]
    assert metrics["agent/env_rewarded"] == 2 and metrics["reward/mean"] == 26.0 / 4
    with pytest.raises(RunError, match=r"returned a reward for 2 of 4 episodes.*gdpo"):
        score_episodes(scorer, results, rows, named_only=True)
    # gdpo with an environment that never rewards: every episode has its named rewards
    quiet = _episodes(tokenizer, ["answer"], RewardsOddTurns, config, rows=rows[::2])
    scores, _ = score_episodes(scorer, episode_results(quiet, 1), rows[::2], named_only=True)
    assert scores["row"].tolist() == [0.0, 20.0]


class CountingEnv:
    """An environment that never ends an episode and records ``close``; the second
    one made fails to close (sync and async closes both allowed)."""

    made: list[CountingEnv] = []

    def __init__(self):
        self.closed = 0
        self.index = len(CountingEnv.made)
        CountingEnv.made.append(self)

    def reset(self, row):
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, message):
        return [{"role": "user", "content": "again"}], False, None

    async def close(self):
        self.closed += 1
        if self.index == 1:
            raise OSError("gone")


def test_every_episode_closes_its_environment_cut_short_or_not(tokenizer, caplog):
    CountingEnv.made = []
    config = AgentLoopConfig(max_turns=2, max_response_tokens=2000, max_model_len=4000)
    episodes = _episodes(tokenizer, ["a", "b"], CountingEnv, config, n=3)
    assert len(episodes) == 3 and all(e.truncated for e in episodes)  # out of turns
    assert [env.closed for env in CountingEnv.made] == [1, 1, 1]
    assert "CountingEnv.close() raised OSError: gone" in caplog.text  # logged, not fatal
