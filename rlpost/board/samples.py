"""The rollout dumps of ``trainer.log_samples`` (``rlpost.loop.sample_log``):
which steps have one, one step's samples filtered, and two steps paired by prompt."""

from __future__ import annotations

import json
import re
from pathlib import Path

KINDS = ("step", "val")
# One sample of a dump as JSON reads it back (``rlpost.loop.sample_log.Sample`` when
# the run wrote it): every value is checked before it is used.
DumpRow = dict[str, object]
_NAME = re.compile(r"(step|val)_(\d+)\.jsonl")


def dump_steps(run_dir: Path) -> dict[str, list[int]]:
    """For each kind (train ``step``, validation ``val``), the steps with a dump."""
    out: dict[str, list[int]] = {k: [] for k in KINDS}
    folder = run_dir / "samples"
    if folder.is_dir():
        for path in folder.iterdir():
            m = _NAME.fullmatch(path.name)
            if m:
                out[m.group(1)].append(int(m.group(2)))
    return {k: sorted(v) for k, v in out.items()}


def read_dump(run_dir: Path, kind: str, step: int) -> list[DumpRow]:
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {', '.join(KINDS)}")
    path = run_dir / "samples" / f"{kind}_{step:06d}.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def total(sample: DumpRow) -> float | None:
    rewards = sample.get("rewards")
    value = rewards.get("total") if isinstance(rewards, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def keep(
    samples: list[DumpRow],
    min_reward: float | None = None,
    max_reward: float | None = None,
    finish: str | None = None,
) -> list[DumpRow]:
    """The samples whose total reward lies in [min_reward, max_reward] and whose
    finish reason is ``finish`` (None: any). A sample without a total is kept
    only when no reward bound is set."""
    out = []
    for s in samples:
        t = total(s)
        if (min_reward is not None or max_reward is not None) and t is None:
            continue
        if min_reward is not None and t is not None and t < min_reward:
            continue
        if max_reward is not None and t is not None and t > max_reward:
            continue
        if finish and str(s.get("finish_reason")) != finish:
            continue
        out.append(s)
    return out


def prompt_key(sample: DumpRow) -> str:
    """A prompt as a comparable string (text, or chat messages as JSON)."""
    prompt = sample.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def pair_by_prompt(
    left: list[DumpRow], right: list[DumpRow]
) -> list[tuple[str, list[DumpRow], list[DumpRow]]]:
    """(prompt, its samples in ``left``, in ``right``), in the order prompts first
    appear in ``left`` then ``right``."""
    order: dict[str, tuple[list[DumpRow], list[DumpRow]]] = {}
    for side, samples in ((0, left), (1, right)):
        for s in samples:
            order.setdefault(prompt_key(s), ([], []))[side].append(s)
    return [(k, a, b) for k, (a, b) in order.items()]


def message_kind(messages: list[object], index: int) -> str:
    """How a chat message is drawn: ``system``, ``prompt`` (the first user
    message), ``model`` (assistant text), ``tool`` (a tool's result) or ``env``
    (a later user message: the environment speaking)."""
    message = messages[index]
    msg = message if isinstance(message, dict) else {}
    role = msg.get("role")
    if role == "assistant":
        return "model"
    if role == "tool":
        return "tool"
    if role == "system":
        return "system"
    earlier = [m for m in messages[:index] if isinstance(m, dict)]
    if role == "user" and not any(m.get("role") == "assistant" for m in earlier):
        return "prompt"
    return "env"
