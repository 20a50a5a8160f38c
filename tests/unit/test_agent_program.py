"""Agent programs: loading and signature checks, what their return values mean, and
the episode a session's segments become (hand-made calls, no server)."""

from __future__ import annotations

import pytest

from rlpost.rollout.agent.capture import Call, segments
from rlpost.rollout.agent.loop import AgentLoopConfig, episode_metrics
from rlpost.rollout.agent.program import ProgramError, _outcome, load_program, session_episode
from rlpost.rollout.agent.sessions import Session
from rlpost.rollout.base import SamplingConfig


def call(prompt, sampled, content="x") -> Call:
    return Call(
        prompt_ids=prompt, sampled_ids=sampled, logprobs=[-1.0] * len(sampled),
        versions=[2] * len(sampled), finish_reason="stop", ended=True, text=content,
        message={"role": "assistant", "content": content},
        request_messages=[{"role": "user", "content": "q"}],
    )  # fmt: skip


def test_segments_follow_exact_prefixes():
    calls = [
        call([1, 2], [3, 4]),
        call([1, 2, 3, 4, 5], [6]),  # extends: 5 is an environment token
        call([1, 2, 3, 4, 5, 6], [7]),  # extends with nothing in between
        call([1, 9], [8]),  # edited history: a new segment
    ]
    first, second = segments(calls)
    assert first.prompt_ids == [1, 2]
    assert first.response_ids == [3, 4, 5, 6, 7]
    assert first.mask == [1, 1, 0, 1, 1]
    assert first.logprobs == [-1.0, -1.0, 0.0, -1.0, -1.0]
    assert first.versions == [2, 2, -1, 2, 2]
    assert (second.prompt_ids, second.response_ids, second.mask) == ([1, 9], [8], [1])
    assert segments([]) == []


def test_a_prompt_shorter_than_the_sequence_so_far_breaks():
    # same start, but the sampled 4 is missing: the agent re-rendered the turn differently
    parts = segments([call([1, 2], [3, 4]), call([1, 2, 3], [5])])
    assert len(parts) == 2


def _broken_session() -> Session:
    session = Session("k", "s-0-0", 0, SamplingConfig(), AgentLoopConfig(3, 64, 128))
    session.calls = [call([1, 2], [3, 4], "a"), call([7], [8, 9, 10], "final")]
    session.sampling_overridden = 2
    return session


def test_with_train_segments_last_the_episode_trains_its_last_segment_and_counts_the_rest():
    episode = session_episode(_broken_session(), chat=None, row={"prompt": "q"}, group=5,
                              status="ok", reward=None, answer=None,
                              all_segments=False)  # fmt: skip
    assert (episode.prompt_ids, episode.response_ids) == ([7], [8, 9, 10])
    assert episode.final_text == "final" and episode.reward is None and episode.group == 5
    assert (episode.prefix_breaks, episode.dropped_tokens, episode.segments) == (1, 2, [])
    m = episode_metrics([episode])
    assert m["agent/prefix_breaks"] == 1 and m["agent/dropped_tokens"] == 2
    assert m["agent/split_samples"] == 0
    assert m["agent/sampling_overridden"] == 2 and m["agent/program_errors"] == 0


def test_by_default_the_segments_before_a_break_are_samples_of_the_episode():
    episode = session_episode(_broken_session(), chat=None, row={"prompt": "q"}, group=5,
                              status="ok", reward=None, answer=None)  # fmt: skip
    assert (episode.prompt_ids, episode.response_ids) == ([7], [8, 9, 10])
    (first,) = episode.segments
    assert (first.prompt_ids, first.response_ids, first.mask) == ([1, 2], [3, 4], [1, 1])
    assert (episode.prefix_breaks, episode.dropped_tokens) == (1, 0)
    m = episode_metrics([episode])
    assert m["agent/split_samples"] == 1 and m["agent/dropped_tokens"] == 0


def test_return_values():
    assert _outcome(None) == (None, None)
    assert _outcome(1) == (1.0, None)
    assert _outcome("42") == (None, "42")
    assert _outcome({"reward": 0.5}) == (0.5, None)
    assert _outcome({"answer": "7"}) == (None, "7")
    for bad in ([1.0], {"score": 1.0}, {"reward": "high"}, {"answer": 7}):
        with pytest.raises(TypeError):
            _outcome(bad)


def test_programs_are_checked_when_loaded(tmp_path):
    path = tmp_path / "agents.py"
    path.write_text(
        "async def good(client, row):\n    return 1.0\n"
        "def plain(client, row):\n    return 1.0\n"
        "def no_row(client):\n    return 1.0\n"
        "class Agent:\n    pass\n"
    )
    assert load_program(f"{path}:good").is_async
    assert not load_program(f"{path}:plain").is_async
    with pytest.raises(ProgramError, match=r"cannot be called as fn\(client, row\)"):
        load_program(f"{path}:no_row")
    with pytest.raises(ProgramError, match="not a function"):
        load_program(f"{path}:Agent")
    with pytest.raises(ProgramError, match="has no attribute 'missing'"):
        load_program(f"{path}:missing")
    with pytest.raises(ProgramError, match="does not exist"):
        load_program(f"{tmp_path}/nope.py:good")
    with pytest.raises(ProgramError, match="malformed"):
        load_program("no_colon")
