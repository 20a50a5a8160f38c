"""A discriminative reward model: ``reward.model.path``.

The model is an ``AutoModelForSequenceClassification`` with one label (the
layout of Skywork-Reward and other Bradley-Terry reward models) whose tokenizer
has a chat template. A sample is rendered as the chat its prompt starts
(``row["prompt"]``, a string being one user message) plus the completion as the
assistant's turn -- or, for a multi-turn episode, its whole conversation -- and
the score is the head's output at the last token.

``SequenceRewardModel`` is the plain object (no Ray) that a worker of its own
holds (``rlpost.workers.reward_model_worker``); ``ModelReward`` is the member of
a ``RewardSet`` that asks it for scores, with the same interface as a reward
function's scorer.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlpost.rewards.scoring import SampleExtras

log = logging.getLogger(__name__)


def check_model_folder(key: str, path: str, chat: bool) -> list[str]:
    """What keeps ``path`` (the value of config ``key``) from being a local model
    folder, with a chat template when ``chat``; read from its files only."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        return [f"{key}={path}: no config.json there; give a local Hugging Face model folder"]
    tokenizer_cfg = folder / "tokenizer_config.json"
    has_template = (folder / "chat_template.jinja").is_file() or (
        tokenizer_cfg.is_file() and json.loads(tokenizer_cfg.read_text()).get("chat_template")
    )
    if chat and not has_template:
        return [
            f"{key}={path}: its tokenizer has no chat template; samples are read as chats "
            "(add the template the model was trained with to tokenizer_config.json)"
        ]
    return []


def check_reward_model(path: str) -> list[str]:
    """What keeps ``path`` from being a reward model rlpost can load, read from its
    files without loading weights (every problem, for the config error)."""
    key = "reward.model.path"
    problems = check_model_folder(key, path, chat=True)
    if not (Path(path) / "config.json").is_file():
        return problems
    config = json.loads((Path(path) / "config.json").read_text())
    archs = config.get("architectures") or []
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        problems.append(
            f"{key}={path}: its architectures {archs} have no classification head (an "
            "...ForSequenceClassification with one label scores a sample); a causal LM "
            "can grade as reward.judge instead"
        )
    labels = len(config.get("id2label") or {}) or config.get("num_labels", 1)
    if labels != 1:
        problems.append(
            f"{key}={path}: the head has {labels} labels; a reward model has one (its score)"
        )
    return problems


def chat_of(
    prompt: str | list[dict], completion: str, messages: list[dict] | None = None
) -> list[dict]:
    """The conversation a reward model scores: an episode's ``messages``, else the
    prompt's messages and the completion as the assistant's turn."""
    if messages:
        return messages
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return [*turns, {"role": "assistant", "content": completion}]


class SequenceRewardModel:
    """Scores chats with a sequence-classification head, ``batch_size`` at a time."""

    def __init__(
        self, path: str, batch_size: int = 16, max_length: int = 2048, dtype: str = "float32"
    ):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "right"
        self.model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=getattr(torch, dtype)
        ).eval()
        if self.model.config.pad_token_id is None:  # the head finds the last token by it
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size, self.max_length = batch_size, max_length

    def render(self, chat: list[dict]) -> list[int]:
        """The token ids of ``chat`` under the model's chat template, cut to
        ``max_length``."""
        from transformers import BatchEncoding

        ids = self.tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)
        assert isinstance(ids, BatchEncoding)  # return_dict=True: the ids and the mask
        return list(ids["input_ids"])[: self.max_length]

    def score(self, chats: list[list[dict]]) -> list[float]:
        """One score per chat. Chats are batched by length (longest first), so a
        batch pads little; the scores come back in input order."""
        import torch

        encoded = [self.render(c) for c in chats]
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        out = [0.0] * len(encoded)
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            width = len(encoded[batch[0]])
            ids_bt = torch.full((len(batch), width), pad, dtype=torch.long)
            mask_bt = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                ids_bt[row, : len(encoded[i])] = torch.tensor(encoded[i])
                mask_bt[row, : len(encoded[i])] = 1
            with torch.no_grad():
                logits_bl = self.model(input_ids=ids_bt, attention_mask=mask_bt).logits
            for row, i in enumerate(batch):
                out[i] = float(logits_bl[row, 0])
        return out


class ModelReward:
    """A reward model's score as one named reward of a ``RewardSet``.

    ``score_chats`` sends chats to the model (the worker's ``score``). A call
    that fails counts every sample of it as an error, scored 0, and the step
    stops past ``max_error_frac`` as for a reward function.
    """

    def __init__(
        self,
        name: str,
        score_chats: Callable[[list[list[dict]]], list[float]],
        max_error_frac: float,
    ):
        self.name, self.score_chats, self.max_error_frac = name, score_chats, max_error_frac
        self.weights: dict[str, float] = {}

    def score(
        self,
        completions: list[str],
        rows: list[dict],
        extras: list[SampleExtras] | None = None,
    ) -> tuple[dict[str, list[float]], dict[str, float]]:
        from rlpost.rewards.loading import RewardError

        extras = extras or [{} for _ in rows]
        chats = [
            chat_of(row.get("prompt", ""), text, extra.get("messages"))
            for text, row, extra in zip(completions, rows, extras)
        ]
        try:
            values = [float(v) for v in self.score_chats(chats)]
            errors = 0
        except Exception:  # a failed batch is counted, like failed reward calls
            failure = traceback.format_exc()
            values, errors = [0.0] * len(chats), len(chats)
            log.warning("reward model %s failed on %d samples: %s", self.name, errors, failure)
            if errors > self.max_error_frac * len(chats):
                raise RewardError(
                    f"reward.model ({self.name}) failed on all {errors} samples of a step, "
                    f"more than reward.max_error_frac={self.max_error_frac:g}:\n{failure}"
                ) from None
        metrics = {"reward/errors": float(errors), "reward/timeouts": 0.0}
        return {"total": values, self.name: values}, metrics

    def close(self) -> None:
        pass
