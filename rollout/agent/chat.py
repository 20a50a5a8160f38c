"""Token ids of a conversation as the chat template lays it out, turn by turn.

The episode loop never re-tokenises what the model said: the model's sampled ids
stay as they are and only the text the template puts *after* them is tokenised
(the "delta"). For an environment turn that is

    close tail  +  environment messages  +  next generation prompt

where the close tail is whatever the template writes after an assistant turn's
content (``"<|im_end|>\\n"`` in ChatML) minus the end token the model itself
sampled (so ``"\\n"`` after a sampled ``<|im_end|>``; the whole close when the
turn was cut by ``max_tokens`` and no end token was sampled).

The environment part is read off a rendering of the real conversation in which
the last assistant message's content is a probe string: everything after that
message's close is the environment's messages and the generation prompt. This
does not need the template to render a conversation's prefix as a prefix (Qwen3
renders the latest assistant turn differently from earlier ones).

Nor is the conversation ever rendered again: each turn's prompt is the previous
prompt + the sampled ids + the delta, so earlier model turns stay exactly as
sampled. Qwen3's template, rendering a chat afresh, rewrites an assistant turn
that holds ``</think>`` into a canonical ``<think>\n...\n</think>\n\n`` block,
and drops the block entirely from turns before the latest user message. The
episode keeps what the model was conditioned on when it sampled: it is one
sequence, every turn's prompt extends the previous one, and the trainer scores
each token in the context it was sampled in. The price is that the model sees
its earlier reasoning during training where a chat server using that template
would hide it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PROBE = "\u27e6assistant-content-probe\u27e7"


class ChatTemplateError(ValueError):
    """The chat template lays out turns in a way the loop cannot follow."""


class ChatTokens:
    """One tokenizer's chat template, with the tool schemas of one environment."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, tools: list[dict] | None = None):
        self.tokenizer = tokenizer
        # a copy, typed as transformers takes it (schemas or functions)
        self.tools: list[dict | Callable[..., object]] | None = list(tools) if tools else None
        probe = self.render(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": PROBE}], False
        )
        if probe.count(PROBE) != 1:
            raise ChatTemplateError(
                "the chat template does not render an assistant message's content verbatim; "
                f"got {probe!r}"
            )
        # What the template writes after an assistant message's content: "<|im_end|>\n".
        self.close = probe.split(PROBE)[1]

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The opening messages and the generation prompt."""
        return self.encode(self.render(messages, True))

    def delta_text(self, history: list[dict], new: list[dict], sampled_end: str | None) -> str:
        """Text between the model's last sampled token and the next generation prompt's end.

        ``history`` ends with the assistant message of the turn just sampled; ``new``
        are the environment's answers; ``sampled_end`` is the decoded end token the
        model sampled, or None when the turn was cut without one.
        """
        tail = self.close
        if sampled_end is not None and self.close.startswith(sampled_end):
            tail = self.close[len(sampled_end) :]
        last = history[-1]
        if last.get("role") != "assistant":
            raise ValueError(f"history must end with the assistant message, got {last!r}")
        probed = [*history[:-1], {**last, "content": PROBE}, *new]
        if not self.close:  # nothing marks the turn's end: render the probe alone
            probed[len(history) - 1] = {"role": "assistant", "content": PROBE}
        text = self.render(probed, True)
        start = text.find(PROBE)
        end = text.find(self.close, start + len(PROBE)) if start >= 0 else -1
        if end < 0:
            raise ChatTemplateError(
                f"the chat template does not close the assistant turn with {self.close!r} "
                "when more messages follow it; the environment's tokens cannot be located"
            )
        return tail + text[end + len(self.close) :]

    def delta_ids(self, history: list[dict], new: list[dict], sampled_end: str | None) -> list[int]:
        """``delta_text`` tokenised on its own (the sampled ids are never re-tokenised)."""
        return self.encode(self.delta_text(history, new, sampled_end))
