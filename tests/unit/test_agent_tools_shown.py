"""A chat template that ignores ``tools=`` is warned about at start-up: the warning
says whether the prompt text names the tools and what taught the model the call
format (the built-in model's calc warm-up), and a template that renders the tools
gets no warning.

The built-in model's template is ``<|role|>content<|end|>`` per message: it never
looks at ``tools``, and the calc prompt ``37*58=`` does not name ``multiply``.
"""

from __future__ import annotations

import copy
import logging

import pytest

from rlpost.config.compose import compose
from rlpost.models.tiny import CHAT_TEMPLATE, build_tokenizer
from rlpost.rollout.agent.tools import load_tool
from rlpost.serving.agent_episodes import AgentRollout, tools_unseen_warning

MULTIPLY = load_tool("multiply").schema
CALC_ROW = {"prompt": "37*58="}
# The built-in template with the tools' names in a system turn, as Qwen's templates do.
TOOLS_TEMPLATE = (
    "{% if tools %}<|system|>tools:{% for t in tools %} {{ t.function.name }}{% endfor %}"
    "<|end|>{% endif %}" + CHAT_TEMPLATE
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _warning(tokenizer, prompt: str, taught: str | None = None) -> str | None:
    messages = [{"role": "user", "content": prompt}]
    return tools_unseen_warning(tokenizer, [MULTIPLY], messages, model="m", taught=taught)


def test_a_template_that_drops_tools_is_named_with_what_the_prompt_shows(tokenizer):
    unseen = _warning(tokenizer, CALC_ROW["prompt"])
    assert unseen is not None
    assert "the chat template of m ignores tools=" in unseen
    assert "never shown multiply; nor does the prompt text name it" in unseen
    assert "nothing else shows the model the tools" in unseen
    assert "chat template that renders tools=" in unseen and "algo=sft" in unseen
    named = _warning(tokenizer, "Call multiply: 37*58=", taught="its warm-up taught it")
    assert named is not None
    assert "the prompt text itself names multiply; its warm-up taught it." in named


def test_a_template_that_renders_tools_gets_no_warning(tokenizer):
    shows = copy.deepcopy(tokenizer)
    shows.chat_template = TOOLS_TEMPLATE
    assert _warning(shows, CALC_ROW["prompt"]) is None


def test_start_up_warns_for_the_builtin_model_and_a_users_model(tokenizer, caplog):
    cpu = ["trainer.device=cpu", "algo=grpo"]
    with caplog.at_level(logging.WARNING, logger="rlpost.serving.agent_episodes"):
        AgentRollout(compose([*cpu, "agent=calculator"]), None, tokenizer, CALC_ROW)
    (builtin,) = [r.getMessage() for r in caplog.records]
    assert "the built-in 'tiny' model ignores tools=" in builtin
    assert "nor does the prompt text name it" in builtin  # "37*58="
    # its warm-up on solved calc chats is the only thing that taught it the call
    assert "its warm-up imitated solved calc episodes, which call multiply" in builtin
    caplog.clear()
    own = [*cpu, "model.path=/models/mine", "agent.tools=[multiply]"]
    with caplog.at_level(logging.WARNING, logger="rlpost.serving.agent_episodes"):
        AgentRollout(compose(own), None, tokenizer, {"prompt": "Use multiply for 37*58."})
    (users,) = [r.getMessage() for r in caplog.records]
    assert "model.path=/models/mine ignores tools=" in users
    assert "the prompt text itself names multiply; nothing else shows" in users
    caplog.clear()
    shows = copy.deepcopy(tokenizer)
    shows.chat_template = TOOLS_TEMPLATE
    with caplog.at_level(logging.WARNING, logger="rlpost.serving.agent_episodes"):
        AgentRollout(compose(own), None, shows, CALC_ROW)
    assert not caplog.records
