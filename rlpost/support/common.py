"""What the support checks share: the columns, outcomes, test data and error lines."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

MAX_GAP = 1e-3  # log-prob agreement required wherever two engines score the same tokens
GRPO_STEPS = 2  # two steps: the second samples from weights the first one synced

# Columns of SUPPORT.md, in order, with what each checks.
CHECKS: dict[str, str] = {
    "build": "tiny random-weight model and byte-level BPE tokenizer (VL: and processor) built "
    "and saved",
    "fsdp": "FSDP2 load; log-probs equal transformers' (eager attention); one policy update "
    "with finite loss and gradients (VL: prompts with an image, gradients through the vision "
    "tower)",
    "lora": "rlpost's default LoRA targets (all-linear) resolve (VL: in the language model "
    "only); the merged weights a sync sends equal PEFT's own merge",
    "vllm": "vLLM loads and generates in a GRPO run; its log-probs equal the trainer's before "
    "any sync (transformers', where the run stopped before its first step)",
    "sync": f"after a weight sync the rollout's log-probs equal the trainer's (< {MAX_GAP:g})",
    "grpo": f"{GRPO_STEPS} GRPO steps through `python -m rlpost.main` with user data files and "
    "a user reward; loss and gradients finite, the final weights moved",
    "export": "the run's final model loads in vLLM and in transformers, and their log-probs "
    f"of vLLM's samples agree (< {MAX_GAP:g})",
}
# Steps (one process each) and the checks each decides.
STEPS: dict[str, tuple[str, ...]] = {
    "build": ("build",),
    "fsdp": ("fsdp",),
    "lora": ("lora",),
    "run": ("vllm", "sync", "grpo"),
    "export": ("export",),
}
Status = Literal["pass", "fail", "skip"]


def architectures() -> list[str]:
    """Every row of SUPPORT.md, in order: the text architectures (``rlpost.models.archs``),
    then the vision-language ones (``rlpost.models.vl``)."""
    from rlpost.models.archs import ARCHS
    from rlpost.models.vl import VL_ARCHS

    return [*ARCHS, *VL_ARCHS]


class OutcomeJson(TypedDict):
    """An ``Outcome`` as a step's result file holds it."""

    status: Status
    text: str


@dataclass(frozen=True)
class Outcome:
    status: Status
    text: str  # pass: what was measured; fail: the error; skip: why it did not run

    @staticmethod
    def from_json(raw: OutcomeJson) -> Outcome:
        return Outcome(raw["status"], raw["text"])


def passed(text: str) -> Outcome:
    return Outcome("pass", text)


def failed(text: str) -> Outcome:
    return Outcome("fail", text)


def skipped(text: str) -> Outcome:
    return Outcome("skip", text)


class CheckFailed(Exception):
    """A check ran and found the architecture not working; the message says how."""


def describe(exc: BaseException) -> str:
    """One line, at most 300 characters: the message of a CheckFailed, else ``Type: message``."""
    text = str(exc) if isinstance(exc, CheckFailed) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:300]


def model_dir(work: Path) -> Path:
    return work / "model"


def run_dir(work: Path) -> Path:
    return work / "run"


TRAIN_TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "reinforcement learning with rewards",
    "a red square and a blue circle",
    "sort these words apple banana cherry",
]
VAL_TEXTS = ["what is the capital of france", "one two three four five"]


def prompt_row(text: str) -> dict:
    """A data row with a chat prompt long enough to outrun Gemma's sliding window."""
    return {
        "prompt": [{"role": "user", "content": f"Reverse the letters of each word: {text}."}],
        "answer": " ".join(w[::-1] for w in text.split()),
    }


ANSI = re.compile(r"\x1b\[[0-9;]*m")
ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)(?:\([\w.]+\))?: .+")


def cli_error(output: str) -> str:
    """The error a failed CLI run reports: rlpost's ``error: ...`` line, else the
    last exception line of a traceback (a Ray task error repeats the worker's)."""
    lines = [ANSI.sub("", line).strip() for line in output.splitlines()]
    for line in reversed(lines):
        if line.startswith("error: "):
            return line.removeprefix("error: ")
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return line
    tail = [line for line in lines if line]
    return tail[-1] if tail else "no output"


def child_error(stderr: str) -> str:
    """The last exception line of a traceback, else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if ERROR_LINE.match(line):
            return " ".join(line.split())[:300]
    return lines[-1][:300] if lines else "no output"
