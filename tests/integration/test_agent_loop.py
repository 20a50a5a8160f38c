"""Multi-turn episodes on the real ``hf`` engine with tiny random models.

What is proved, for the tiny template and a ChatML template with tools: the
response is exactly the engine's sampled ids plus the template's delta ids per
turn (each turn's prompt is the previous prompt + sampled + delta), decoding it
gives the template's rendering of the chat, the mask is 1 exactly on sampled ids,
the log-probs are the engine's and a plain transformers forward reproduces them
(trainer parity on a multi-turn sequence), the limits stop episodes, and all
episodes are in flight at once.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F
from tokenizers import AddedToken
from transformers import GenerationConfig, Qwen2ForCausalLM

from rlpost.tiny import build_config, build_tiny_model, build_tokenizer
from rollout.agent.chat import ChatTokens
from rollout.agent.env import ToolEnv
from rollout.agent.loop import AgentLoopConfig, Episode, engine_generate, run_episodes
from rollout.agent.tools import load_tool
from rollout.base import Completion, SamplingConfig
from rollout.hf import HFEngine, HFEngineConfig

# ChatML-style: "<|im_end|>\n" closes every turn, so a sampled <|im_end|> leaves "\n" to the delta.
CHATML = (
    "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ROWS = [{"prompt": "12+30="}, {"prompt": "hello"}, {"prompt": "a b c"}, {"prompt": "9*9="}]
SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=12, seed=7)


class ThreeUserTurns:
    """Answers every assistant turn with a fixed message; done after ``turns`` answers."""

    def __init__(self, turns: int = 3, role: str = "user", tools: list[dict] | None = None):
        self.turns, self.role, self.seen = turns, role, 0
        if tools is not None:
            self.tool_schemas = tools

    def reset(self, row: dict) -> list[dict]:
        return [{"role": "user", "content": row["prompt"]}]

    async def step(self, message: dict) -> tuple[list[dict], bool, float | None]:
        self.seen += 1
        if self.seen >= self.turns:
            return [], True, float(self.seen)
        return [{"role": self.role, "content": f"again {self.seen}"}], False, float(self.seen)


class Recorder:
    """The real engine's generate, recording every call and the calls in flight."""

    def __init__(self, engine: HFEngine):
        self.inner = engine_generate(engine)
        self.calls: list[tuple[str, list[int], SamplingConfig, Completion]] = []
        self.in_flight = self.max_in_flight = 0

    async def __call__(self, prompt_ids: list[int], sampling: SamplingConfig, session_id: str):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            completion = await self.inner(prompt_ids, sampling, session_id)
        finally:
            self.in_flight -= 1
        self.calls.append((session_id, list(prompt_ids), sampling, completion))
        return completion


def _chatml_model(out_dir) -> str:
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")],
        special_tokens=True,
    )
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = CHATML
    config = build_config("micro", tokenizer)
    config.initializer_range, config.eos_token_id = 0.3, tokenizer.eos_token_id
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


@pytest.fixture(scope="module")
def loop():
    # one event loop for the module: an engine's lock belongs to the loop that first used it
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> HFEngine:
    # init_std 0.3: at the default 0.02 an untrained model repeats one token.
    path = build_tiny_model("micro", tmp_path_factory.mktemp("m") / "micro", 0, init_std=0.3)
    return HFEngine(HFEngineConfig(model_path=str(path)))


@pytest.fixture(scope="module")
def chatml(tmp_path_factory) -> HFEngine:
    return HFEngine(HFEngineConfig(model_path=_chatml_model(tmp_path_factory.mktemp("chatml"))))


def _run(loop, engine, make_env, config, rows=ROWS, n=2, sampling=SAMPLING):
    recorder = Recorder(engine)
    episodes = loop.run_until_complete(
        run_episodes(
            rows, n, generate=recorder, tokenizer=engine.tokenizer, make_env=make_env,
            sampling=sampling, config=config, session_prefix="t",
        )
    )  # fmt: skip
    return episodes, recorder


def _expected_text(ep: Episode, chat: ChatTokens) -> str:
    """The template's rendering of the episode's chat, assistant turns as sampled."""
    messages, k = [], 0
    for m in ep.messages:
        if m["role"] == "assistant":
            m = {**m, "content": ep.turns[k].text}
            k += 1
        messages.append(m)
    text = chat.render(messages, False)
    # The last turn's tokens stop where the model stopped: without the close the
    # template adds after a sampled end token (or without all of it, if cut).
    last = ep.turns[-1]
    end = chat.decode(last.sampled_ids[-1:]) if last.finish_reason == "stop" else ""
    return text[: len(text) - len(chat.close) + len(end)]


def _check_token_in_token_out(episodes: list[Episode], recorder: Recorder):
    calls_by_session: dict[str, list] = {}
    for session, prompt, _, completion in recorder.calls:
        calls_by_session.setdefault(session, []).append((prompt, completion))
    finishes = set()
    for ep in episodes:
        calls = calls_by_session[ep.session_id]
        assert len(calls) == ep.num_turns == len(ep.turns) == 3
        # (a) prompt of turn k = prompt + everything before; sampled ids verbatim; deltas between
        expected_ids: list[int] = []
        expected_mask: list[int] = []
        expected_logp: list[float] = []
        for (prompt, completion), turn in zip(calls, ep.turns):
            assert prompt == ep.prompt_ids + expected_ids
            assert turn.sampled_ids == completion.token_ids
            expected_ids += completion.token_ids + turn.env_ids
            expected_mask += [1] * len(completion.token_ids) + [0] * len(turn.env_ids)
            expected_logp += completion.logprobs + [0.0] * len(turn.env_ids)
            finishes.add(completion.finish_reason)
        assert ep.turns[-1].env_ids == [] and all(t.env_ids for t in ep.turns[:-1])
        assert ep.response_ids == expected_ids
        # (b) mask is 1 exactly on the sampled ids; (c) the engine's log-probs, 0 elsewhere
        assert ep.response_mask == expected_mask and ep.logprobs == expected_logp
        assert ep.model_tokens == sum(expected_mask)
        assert ep.env_tokens == len(expected_mask) - sum(expected_mask) > 0
        assert ep.reward == 3.0 and not ep.truncated
    assert finishes == {"stop", "length"}, "both ways a turn ends must be exercised"


@torch.no_grad()
def _check_trainer_parity(episodes: list[Episode], engine: HFEngine):
    """(c) a teacher-forced transformers forward gives the engine's log-probs on every
    model token of the multi-turn sequence (temperature 1, top-p 1)."""
    for ep in episodes:
        ids = torch.tensor([ep.prompt_ids + ep.response_ids])
        logits_tv = engine.model(ids).logits[0, :-1]
        logp_t = -F.cross_entropy(logits_tv, ids[0, 1:], reduction="none")
        p = len(ep.prompt_ids)
        mask_t = torch.tensor(ep.response_mask, dtype=torch.bool)
        resp_logp_t = logp_t[p - 1 :]
        torch.testing.assert_close(
            resp_logp_t[mask_t], torch.tensor(ep.logprobs)[mask_t], atol=1e-4, rtol=0
        )


def test_tiny_template_episodes_are_token_in_token_out(loop, tiny):
    config = AgentLoopConfig(max_turns=8, max_response_tokens=200, max_model_len=256, parser=None)
    episodes, recorder = _run(loop, tiny, lambda: ThreeUserTurns(), config)
    _check_token_in_token_out(episodes, recorder)
    chat = ChatTokens(tiny.tokenizer)
    for ep in episodes:
        assert chat.decode(ep.prompt_ids + ep.response_ids) == _expected_text(ep, chat)
        assert ep.messages[-1] == {"role": "assistant", "content": ep.final_text}
    _check_trainer_parity(episodes, tiny)
    # (e) every episode was waiting on the engine at once
    assert recorder.max_in_flight == len(ROWS) * 2
    # the two samples of a row are one group with different seeds, hence different tokens
    assert [ep.group for ep in episodes] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert len({ep.session_id for ep in episodes}) == len(episodes)
    for a, b in zip(episodes[::2], episodes[1::2]):
        assert a.response_ids != b.response_ids


def test_chatml_template_with_tools(loop, chatml):
    tools = [load_tool("calculator").schema]
    config = AgentLoopConfig(max_turns=8, max_response_tokens=200, max_model_len=256)
    episodes, recorder = _run(
        loop, chatml, lambda: ThreeUserTurns(role="tool", tools=tools), config
    )
    _check_token_in_token_out(episodes, recorder)
    chat = ChatTokens(chatml.tokenizer, tools)
    assert chat.decode(episodes[0].prompt_ids).startswith("<|im_start|>system\ntools: calculator")
    for ep in episodes:
        text = chat.decode(ep.prompt_ids + ep.response_ids)
        assert text == _expected_text(ep, chat)
        for turn in ep.turns[:-1]:  # the delta closes the turn: "\n" after a sampled end
            delta = chat.decode(turn.env_ids)
            close = "\n" if turn.finish_reason == "stop" else "<|im_end|>\n"
            assert delta.startswith(close + "<|im_start|>tool\nagain ")
            assert delta.endswith("<|im_end|>\n<|im_start|>assistant\n")
    _check_trainer_parity(episodes, chatml)


def test_tool_calls_round_trip_through_tool_env(chatml):
    """A scripted policy (fixed token ids, not an engine) that calls the calculator once:
    the tool's answer comes back as a tool message and the rendering still matches."""
    tok = chatml.tokenizer
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    script = [f"let me see{call}", "it is 42"]

    turns = iter(script)

    async def scripted(prompt_ids, sampling, session_id):
        text = next(turns)
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return Completion(ids, [0.0] * len(ids), text, "stop")

    config = AgentLoopConfig(max_turns=4, max_response_tokens=200, max_model_len=256)
    episodes = asyncio.run(
        run_episodes(
            [{"prompt": "6*7?"}], 1, generate=scripted, tokenizer=tok,
            make_env=lambda: ToolEnv(["calculator"], timeout_s=10), sampling=SAMPLING,
            config=config,
        )
    )  # fmt: skip
    ep = episodes[0]
    assert ep.num_turns == 2 and ep.tool_calls == 1 and ep.tool_errors == 0 and not ep.truncated
    assert ep.messages[2] == {
        "role": "tool", "name": "calculator", "content": "42", "tool_call_id": "call_0"
    }  # fmt: skip
    assert ep.messages[1]["content"] == "let me see" and ep.final_text == "it is 42"
    chat = ChatTokens(tok, [load_tool("calculator").schema])
    rendered = chat.render(ep.messages, False)
    assert chat.decode(ep.prompt_ids + ep.response_ids) == rendered[: -len("\n")]
    assert chat.decode(ep.turns[0].env_ids) == (
        "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    )


def test_limits_stop_episodes_and_truncate(loop, tiny):
    endless = lambda: ThreeUserTurns(turns=10**6)  # noqa: E731
    # max_turns: two model turns, the environment never says done
    config = AgentLoopConfig(max_turns=2, max_response_tokens=200, max_model_len=256, parser=None)
    episodes, _ = _run(loop, tiny, endless, config, rows=ROWS[:2], n=1)
    assert all(ep.num_turns == 2 and ep.truncated for ep in episodes)
    # max_response_tokens: each turn asks for min(12, budget left); the response never exceeds it
    budget = 30
    config = AgentLoopConfig(
        max_turns=50, max_response_tokens=budget, max_model_len=256, parser=None
    )
    episodes, recorder = _run(loop, tiny, endless, config, rows=ROWS[:2], n=1)
    for ep in episodes:
        assert ep.truncated and len(ep.response_ids) <= budget
        calls = [(p, s) for sid, p, s, _ in recorder.calls if sid == ep.session_id]
        for prompt, sampling in calls:
            used = len(prompt) - len(ep.prompt_ids)
            assert sampling.max_tokens == min(12, budget - used)
    # max_model_len bounds prompt + response
    config = AgentLoopConfig(max_turns=50, max_response_tokens=200, max_model_len=40, parser=None)
    episodes, _ = _run(loop, tiny, endless, config, rows=ROWS[:2], n=1)
    assert all(ep.truncated and len(ep.prompt_ids) + len(ep.response_ids) <= 40 for ep in episodes)
