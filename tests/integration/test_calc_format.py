"""The calc task's warm-up chats are the episodes the agent loop produces, token for token.

A scripted generate (it replays the SFT chat's assistant turns as token ids, the
only stand-in here) drives a real ``ToolEnv`` with the real ``multiply`` tool
through ``run_episodes``; the episode's prompt + response ids must equal
``conversation_tokens`` of the SFT row, its mask must be the SFT loss mask, and
the reward must score its final answer as correct.
"""

from __future__ import annotations

import asyncio

from rlpost.data.samples import conversation_tokens
from rlpost.data.tasks.calc import CalcTask, reward
from rlpost.models.tiny import build_tokenizer
from rlpost.rollout.agent.env import ToolEnv
from rlpost.rollout.agent.loop import AgentLoopConfig, run_episodes
from rlpost.rollout.base import Completion, SamplingConfig


class ScriptedGenerate:
    """Stand-in for the engine: returns the given turns' ids in order, each ended by
    the end token, whatever the prompt."""

    def __init__(self, tokenizer, turns: list[str]):
        self.eos = tokenizer.eos_token_id
        self.turns = [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in turns]
        self.prompts: list[list[int]] = []

    async def __call__(self, prompt_ids: list[int], sampling: SamplingConfig, session_id: str):
        self.prompts.append(list(prompt_ids))
        ids = self.turns[len(self.prompts) - 1] + [self.eos]
        return Completion(ids, [-0.5] * len(ids), "", "stop")


def test_sft_chat_renders_like_a_real_episode():
    tok = build_tokenizer()
    row = CalcTask(seed=0, num_val=20).sft_rows()[0]
    chat = row["messages"]
    generate = ScriptedGenerate(tok, [m["content"] for m in chat if m["role"] == "assistant"])
    (episode,) = asyncio.run(
        run_episodes(
            [row], 1, generate=generate, tokenizer=tok, make_env=lambda: ToolEnv(["multiply"]),
            sampling=SamplingConfig(temperature=0.0, max_tokens=80),
            config=AgentLoopConfig(max_turns=3, max_response_tokens=128, max_model_len=256),
        )
    )  # fmt: skip
    ids, mask = conversation_tokens(tok, chat)
    assert episode.prompt_ids + episode.response_ids == ids
    assert [0] * len(episode.prompt_ids) + episode.response_mask == mask
    a, b = (int(x) for x in row["prompt"].rstrip("=").split("*"))
    # the real tool answered; its message is the SFT chat's tool turn
    assert episode.messages[2] == chat[2] and chat[2]["content"] == str(a * b)
    assert (episode.tool_calls, episode.tool_errors, episode.num_turns) == (1, 0, 2)
    assert not episode.truncated and episode.final_text == row["answer"]
    assert reward(episode.final_text, row)["correctness"] == 1.0
    text = tok.decode(ids)
    assert text == (
        f"<|user|>{a}*{b}=<|end|><|assistant|>"
        f'<tool_call>{{"name":"multiply","arguments":{{"a":{a},"b":{b}}}}}</tool_call><|end|>'
        f"<|tool|>{a * b}<|end|><|assistant|>{a * b}<|end|>"
    )
