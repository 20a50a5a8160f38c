"""Before Ray starts: whether a vLLM PD run's prompts are long enough for the KV
connector to move anything.

The connector moves whole ``rollout.block_size`` blocks of a prompt but its last
token (``rlpost.rollout.pd.min_transfer_tokens``); shorter prompts are computed
whole on the decode side, the prefill replicas do their work for nothing and
``rollout/pd/kv_transfer_rate`` stays 0. The built-in tasks' prompts are 7-9
tokens. The prompts are measured with the run's tokenizer where it is at hand
without Ray (the built-in text model's, or a local ``model.path``'s);
``RolloutGroup.stats`` warns at run time in the other cases.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from rlpost.config.groups import Config

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)
CHECKED = 512  # training rows measured
WARN_SHARE = 0.5  # warn when at least this share of the prompts moves nothing


def prompt_tokenizer(cfg: Config) -> PreTrainedTokenizerBase | None:
    """The run's tokenizer when it loads without Ray or a download: the built-in
    text model's, or a local ``model.path``'s; None otherwise (a hub id, a VL model,
    whose image tokens the rows do not show)."""
    from rlpost.models.warmup import VL_PRESETS

    if cfg.model.path is None:
        if cfg.model.preset in VL_PRESETS:
            return None
        from rlpost.models.charset import builtin_tokenizer

        return builtin_tokenizer(cfg.model.preset)
    path = Path(cfg.model.path).expanduser()
    if (
        not (path / "tokenizer_config.json").is_file()
        or (path / "preprocessor_config.json").exists()
    ):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def short_prompts_warning(block_size: int, lengths: list[int]) -> str | None:
    """The warning for prompts of ``lengths`` tokens under PD with ``block_size``,
    or None when most of them move KV."""
    from rlpost.rollout.pd import min_transfer_tokens

    if not lengths:
        return None
    need = min_transfer_tokens(block_size)
    short = sum(n < need for n in lengths)
    if short < WARN_SHARE * len(lengths):
        return None
    if short == len(lengths):
        which, rate = "none of these prompts moves", "stays 0"
    else:
        which, rate = f"{short} of {len(lengths)} prompts move", "stays low"
    smaller = ""
    gpu_block = 16  # a GPU backend's smallest; the CPU backend's is 32
    if block_size > gpu_block and sum(n < min_transfer_tokens(gpu_block) for n in lengths) < short:
        smaller = f", or on a GPU rollout.block_size={gpu_block} (32 is the CPU backend's smallest)"
    return (
        f"rollout.pd.enabled=true: {which} KV from the prefill to the decode replicas. "
        f"The KV connector moves whole rollout.block_size={block_size}-token blocks of a "
        f"prompt but its last token, so a prompt needs at least {need} tokens, and these "
        f"have {min(lengths)}-{max(lengths)} ({len(lengths)} measured); the decode replicas "
        f"compute the short ones whole and rollout/pd/kv_transfer_rate {rate}. PD pays off "
        f"for long prompts: for these use rollout.pd.enabled=false (rollout=vllm){smaller}"
    )


def check_pd_prompts(cfg: Config, rows: list[dict]) -> str | None:
    """The short-prompt warning for a vLLM PD run's training rows, or None (not PD,
    agent mode, whose prompts grow turn by turn, or no tokenizer at hand)."""
    r = cfg.rollout
    if not (r.pd.enabled and r.name == "vllm" and r.block_size) or cfg.agent.enabled:
        return None
    tokenizer = prompt_tokenizer(cfg)
    if tokenizer is None:
        return None
    from rlpost.data.rows import validate_row
    from rlpost.data.samples import encode_prompt

    sample = [row for row in rows[:CHECKED] if validate_row(row) is None]
    lengths = [len(encode_prompt(tokenizer, row)) for row in sample]
    return short_prompts_warning(r.block_size, lengths)
