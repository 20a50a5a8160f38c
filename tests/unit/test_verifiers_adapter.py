"""verifiers environments as agent programs (``agent.program=verifiers:...``), run with
the real verifiers package against rlpost's chat endpoint and ``ScriptedEngine``:
each episode is one verifiers rollout (its ``null`` chat harness in the subprocess
runtime, its interception server, then the endpoint under the episode's key), and
its reward is the task's own ``@vf.reward`` functions, weighted."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from rlpost.rollout.agent.program import ProgramError, load_program, run_program_episodes
from rlpost.rollout.agent.verifiers_adapter import verifiers_rows
from tests.unit.test_agent_endpoint import LIMITS, SAMPLING, serve

SPEC = f"verifiers:{Path(__file__).resolve().parents[1] / 'integration/programs/vf_sums.py'}"
CHAT = {"agent": {"harness": {"id": "null"}}}  # the tool-less chat harness


def test_data_rows_are_the_tasksets_tasks_in_order():
    train, val = verifiers_rows(SPEC, CHAT, num_val=2)
    assert [r["prompt"] for r in train] == [
        [{"role": "user", "content": p}] for p in ["1+2=", "3+4=", "5+6=", "7+8="]
    ]
    assert [r["vf_idx"] for r in train] == [0, 1, 2, 3]
    assert val == train[:2] and train[0]["data_source"] == "verifiers/vf_sums"


def test_each_episode_is_one_verifiers_rollout_scored_by_its_rubric(tokenizer):
    program = load_program(SPEC, CHAT)
    # the model's replies, one per episode in row order: right, wrong and short,
    # right, wrong and long
    endpoint, engine = serve(tokenizer, ["3", "8", "11", "99999"])
    train, _ = verifiers_rows(SPEC, CHAT, num_val=1)
    limit = threading.Semaphore(1)  # one at a time: the script's order
    episodes = asyncio.run(
        run_program_episodes(
            train, 1, program=program, endpoint=endpoint, tokenizer=tokenizer,
            sampling=SAMPLING, config=LIMITS, session_prefix="vf", timeout_s=120, limit=limit,
        )
    )  # fmt: skip
    endpoint.close()
    # reward = 1.0 * exact + 0.5 * (reply <= 2 chars) + 0.25 * (any reply):
    # "3" = 1+2 -> 1 + 0.5 + 0.25; "8" != 7 -> 0 + 0.5 + 0.25; "11" = 5+6 -> 1.75;
    # "99999" -> 0 + 0 + 0.25
    assert [e.reward for e in episodes] == [1.75, 0.75, 1.75, 0.25]
    assert [e.program for e in episodes] == ["ok"] * 4
    # each rollout made exactly one call, with the task's prompt, through the endpoint
    assert [len(r[0]) > 0 for r in engine.requests] == [True] * 4
    assert [r[2] for r in engine.requests] == ["vf-0-0", "vf-1-0", "vf-2-0", "vf-3-0"]
    for e, text, prompt in zip(
        episodes, ["3", "8", "11", "99999"], ["1+2=", "3+4=", "5+6=", "7+8="]
    ):
        sampled = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        assert e.response_ids == [*sampled, tokenizer.eos_token_id]
        assert e.response_mask == [1] * (len(sampled) + 1)
        assert e.messages[0]["content"] == prompt and e.messages[-1]["content"] == text


def test_a_row_from_data_files_is_built_into_the_tasksets_task(tokenizer):
    program = load_program(SPEC, CHAT)
    endpoint, _ = serve(tokenizer, ["10"])
    rows = [{"prompt": "4+6=", "answer": "10"}]  # data=files: the TaskData's fields
    (episode,) = asyncio.run(
        run_program_episodes(
            rows, 1, program=program, endpoint=endpoint, tokenizer=tokenizer,
            sampling=SAMPLING, config=LIMITS, session_prefix="f", timeout_s=120,
        )
    )  # fmt: skip
    endpoint.close()
    assert episode.reward == 1.75  # exact (10 = 4+6) + 0.5 * short + 0.25 * replied


def test_bad_specs_and_env_kwargs_are_program_errors():
    with pytest.raises(ProgramError, match="names no taskset"):
        load_program("verifiers:")
    with pytest.raises(ProgramError, match="does not exist"):
        load_program("verifiers:nope/missing.py")
    with pytest.raises(ProgramError, match="differs from the spec"):
        load_program(SPEC, {"taskset": {"id": "other"}})
    with pytest.raises(ProgramError, match="harness"):
        load_program(SPEC, {"agent": {"harness": {"id": "no-such-harness"}}})


@pytest.fixture(scope="module")
def tokenizer():
    from rlpost.models.tiny import build_tokenizer

    return build_tokenizer()
