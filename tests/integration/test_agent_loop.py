"""Multi-turn episodes on the real ``hf`` engine with tiny random models.

What is proved, for the tiny template, a ChatML template with tools and the real
Qwen2.5 and Qwen3 templates (``chat_templates.py``): the response is exactly the
engine's sampled ids plus the template's delta ids per turn (each turn's prompt is
the previous prompt + sampled + delta), decoding it gives the template's rendering
of the chat with the model's turns verbatim, the mask is 1 exactly on sampled ids,
the log-probs are the engine's and a plain transformers forward reproduces them
(trainer parity on a multi-turn sequence), the limits stop episodes, and all
episodes are in flight at once. Tool replies under the Qwen templates are
``<tool_response>`` blocks in a user turn; where Qwen3's template would re-render
an earlier turn (its ``<think>`` block), the episode keeps the turn as sampled.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
import torch.nn.functional as F
from chat_templates import QWEN2_5, QWEN2_5_TOKENS, QWEN3, QWEN3_TOKENS
from tokenizers import AddedToken
from transformers import GenerationConfig, Qwen2ForCausalLM

from rlpost.models.tiny import build_config, build_tiny_model, build_tokenizer
from rlpost.rollout.agent.chat import ChatTokens
from rlpost.rollout.agent.env import ToolEnv
from rlpost.rollout.agent.loop import AgentLoopConfig, Episode, engine_generate, run_episodes
from rlpost.rollout.agent.tools import load_tool
from rlpost.rollout.base import Completion, SamplingConfig
from rlpost.rollout.hf import HFEngine, HFEngineConfig

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

    def __init__(
        self,
        turns: int = 3,
        role: str = "user",
        tools: list[dict] | None = None,
        system: str | None = None,
    ):
        self.turns, self.role, self.seen, self.system = turns, role, 0, system
        if tools is not None:
            self.tool_schemas = tools

    def reset(self, row: dict) -> list[dict]:
        opening = [{"role": "system", "content": self.system}] if self.system else []
        return [*opening, {"role": "user", "content": row["prompt"]}]

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


def _chatml_model(out_dir, template: str = CHATML, added: tuple[str, ...] = ()) -> str:
    """A tiny random Qwen2 model whose tokenizer has ``<|im_start|>`` / ``<|im_end|>`` as
    special tokens, ``added`` as plain added tokens (as Qwen's ``<tool_call>``, ``<think>``
    ...) and ``template`` as its chat template."""
    tokenizer = build_tokenizer()
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")],
        special_tokens=True,
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = template
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


QWEN = {"qwen2.5": (QWEN2_5, QWEN2_5_TOKENS), "qwen3": (QWEN3, QWEN3_TOKENS)}


@pytest.fixture(scope="module", params=sorted(QWEN))
def qwen(request, tmp_path_factory) -> tuple[str, HFEngine]:
    """The tiny model with a real Qwen chat template and the tokens its markup uses."""
    template, added = QWEN[request.param]
    path = _chatml_model(tmp_path_factory.mktemp(request.param), template, added)
    return request.param, HFEngine(HFEngineConfig(model_path=path))


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
        # the environment ends after 3 turns; a last turn cut at max_tokens leaves it unfinished
        assert ep.reward == 3.0 and ep.truncated == (ep.turns[-1].finish_reason == "length")
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


def _verbatim_prompt(chat: ChatTokens, ep: Episode, turn: int) -> str:
    """Turn ``turn``'s prompt as the contract defines it: the template's rendering of the
    chat up to that turn with every earlier assistant turn exactly as sampled.

    The template renders placeholders, which the sampled texts then replace: Qwen3
    re-renders an assistant message holding ``</think>`` (it moves the reasoning into a
    canonical ``<think>\n...\n</think>\n\n`` block, or drops it before the latest user
    query), and the loop must not follow it there.
    """
    messages, k = [], 0
    for m in ep.messages:
        if k == turn and m["role"] == "assistant":
            break
        if m["role"] == "assistant":
            m = {"role": "assistant", "content": f"\u27e6turn {k}\u27e7"}
            k += 1
        messages.append(m)
    text = chat.render(messages, True)
    for j in range(turn):
        assert text.count(f"\u27e6turn {j}\u27e7") == 1
        text = text.replace(f"\u27e6turn {j}\u27e7", ep.turns[j].text)
    return text


def test_qwen_templates_tool_replies_are_token_in_token_out(loop, qwen):
    """The real Qwen2.5 / Qwen3 templates: a tool's reply comes back as a <tool_response>
    block inside a user turn, and the trajectory is still the sampled ids + those deltas."""
    name, engine = qwen
    config = AgentLoopConfig(max_turns=8, max_response_tokens=200, max_model_len=256)
    # a short system message: Qwen2.5's default one would not leave room in 256 positions
    make_env = lambda: ThreeUserTurns(role="tool", system="Be brief.")  # noqa: E731
    episodes, recorder = _run(loop, engine, make_env, config)
    _check_token_in_token_out(episodes, recorder)
    chat = ChatTokens(engine.tokenizer)
    for ep in episodes:
        assert chat.decode(ep.prompt_ids) == (
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            f"<|im_start|>user\n{ep.messages[1]['content']}<|im_end|>\n<|im_start|>assistant\n"
        )
        for k, turn in enumerate(ep.turns[:-1], start=1):
            close = "\n" if turn.finish_reason == "stop" else "<|im_end|>\n"
            assert chat.decode(turn.env_ids) == (
                f"{close}<|im_start|>user\n<tool_response>\nagain {k}\n</tool_response>"
                "<|im_end|>\n<|im_start|>assistant\n"
            )
        # each turn's prompt is the template's rendering of the chat so far, model turns verbatim
        prompts = [p for session, p, _, _ in recorder.calls if session == ep.session_id]
        for k, prompt in enumerate(prompts):
            assert chat.decode(prompt) == _verbatim_prompt(chat, ep, k)
    if name == "qwen3":  # this seed samples "</think>" in an earlier turn: the re-render case
        assert any("</think>" in t.text for ep in episodes for t in ep.turns[:-1])
    _check_trainer_parity(episodes, engine)


def _scripted(tokenizer, texts: list[str]):
    """A fixed policy (not an engine): turn k samples ``texts[k]`` and the end token."""
    turns = iter(texts)

    async def generate(prompt_ids, sampling, session_id):
        text = next(turns)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return Completion(ids, [0.0] * len(ids), text, "stop")

    return generate


QWEN_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'


def test_qwen_tool_calls_round_trip_through_tool_env(qwen):
    """A Hermes call in the form the Qwen templates write it, answered by the calculator:
    tool schemas in the system turn, the reply as <tool_response> in a user turn."""
    name, engine = qwen
    tok = engine.tokenizer
    script = [f"<think>\nI need the tool.\n</think>\n\n{QWEN_CALL}", "It is 42."]
    config = AgentLoopConfig(max_turns=4, max_response_tokens=200, max_model_len=4096)
    recorder: list[list[int]] = []
    generate = _scripted(tok, script)

    async def recording(prompt_ids, sampling, session_id):
        recorder.append(list(prompt_ids))
        return await generate(prompt_ids, sampling, session_id)

    episodes = asyncio.run(
        run_episodes(
            [{"prompt": "6*7?"}], 1, generate=recording, tokenizer=tok,
            make_env=lambda: ToolEnv(["calculator"], timeout_s=10), sampling=SAMPLING,
            config=config,
        )
    )  # fmt: skip
    ep = episodes[0]
    assert ep.num_turns == 2 and ep.tool_calls == 1 and ep.tool_errors == 0 and not ep.truncated
    assert ep.messages[2] == {
        "role": "tool", "name": "calculator", "content": "42", "tool_call_id": "call_0"
    }  # fmt: skip
    assert ep.final_text == "It is 42."
    chat = ChatTokens(tok, [load_tool("calculator").schema])
    system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
    tools_header = (
        f"<|im_start|>system\n{system if name == 'qwen2.5' else ''}# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "calculator", '
    )
    assert chat.decode(ep.prompt_ids).startswith(tools_header)
    assert chat.decode(ep.prompt_ids).endswith(
        "<|im_start|>user\n6*7?<|im_end|>\n<|im_start|>assistant\n"
    )
    delta = (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert chat.decode(ep.turns[0].env_ids) == delta
    # token in, token out: turn 2's prompt is turn 1's + the sampled ids + the delta
    assert recorder[1] == ep.prompt_ids + ep.turns[0].sampled_ids + ep.turns[0].env_ids
    n_model, n_env = len(ep.turns[0].sampled_ids), len(ep.turns[0].env_ids)
    assert ep.response_mask == [1] * n_model + [0] * n_env + [1] * len(ep.turns[1].sampled_ids)
    assert chat.decode(ep.prompt_ids + ep.response_ids) == (
        chat.decode(ep.prompt_ids) + script[0] + "<|im_end|>" + delta + script[1] + "<|im_end|>"
    )
    if name == "qwen3":
        # Between tool calls Qwen3 keeps the reasoning (no new user query): its own rendering
        # of the parsed chat is the trajectory's, token for token.
        assert chat.prompt_ids(ep.messages[:3]) == recorder[1]


@pytest.mark.parametrize("qwen", ["qwen3"], indirect=True)
def test_qwen3_earlier_thinking_stays_as_sampled(qwen):
    """After a new user message Qwen3's template drops the <think> blocks of earlier assistant
    turns, so rendering the chat afresh would change the prefix the model already saw. The
    loop never re-renders: turn 2's prompt extends turn 1's, thinking included."""
    _, engine = qwen
    tok = engine.tokenizer
    script = ["<think>\nplan\n</think>\n\nhello", "<think>\nmore\n</think>\n\nbye"]
    config = AgentLoopConfig(max_turns=4, max_response_tokens=200, max_model_len=256)
    generate = _scripted(tok, script)
    prompts: list[list[int]] = []

    async def recording(prompt_ids, sampling, session_id):
        prompts.append(list(prompt_ids))
        return await generate(prompt_ids, sampling, session_id)

    episodes = asyncio.run(
        run_episodes(
            [{"prompt": "hi"}], 1, generate=recording, tokenizer=tok,
            make_env=lambda: ThreeUserTurns(turns=2), sampling=SAMPLING, config=config,
        )
    )  # fmt: skip
    ep = episodes[0]
    chat = ChatTokens(tok)
    assert ep.num_turns == 2 and ep.reward == 2.0 and not ep.truncated
    assert chat.decode(ep.turns[0].env_ids) == (
        "\n<|im_start|>user\nagain 1<|im_end|>\n<|im_start|>assistant\n"
    )
    assert prompts[1] == ep.prompt_ids + ep.turns[0].sampled_ids + ep.turns[0].env_ids
    opening = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert chat.decode(prompts[1]) == (
        f"{opening}<think>\nplan\n</think>\n\nhello<|im_end|>\n"
        "<|im_start|>user\nagain 1<|im_end|>\n<|im_start|>assistant\n"
    )
    # the template's fresh rendering of the same chat: turn 1's thinking is gone
    fresh = chat.prompt_ids(ep.messages[:3])
    assert chat.decode(fresh) == (
        f"{opening}hello<|im_end|>\n<|im_start|>user\nagain 1<|im_end|>\n<|im_start|>assistant\n"
    )
    assert fresh != prompts[1]  # re-rendering would change tokens the model has conditioned on
    assert chat.decode(ep.response_ids) == (
        script[0]
        + "<|im_end|>\n<|im_start|>user\nagain 1<|im_end|>\n<|im_start|>assistant\n"
        + script[1]
        + "<|im_end|>"
    )
