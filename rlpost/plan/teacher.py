"""``algo=opd``'s teacher, checked before Ray starts: a model folder whose tokenizer
has the student's vocabulary. The teacher reads the student's sampled token ids and
returns a log-prob for each; under another vocabulary id 17 is another string, and
the reverse KL it gives would be noise, not an error."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rlpost.config.groups import Config

log = logging.getLogger(__name__)
SHOWN = 3  # differing tokens a problem names


def check_teacher(cfg: Config) -> list[str]:
    """``teacher.path``: a model folder (a hub id passes unchecked, nothing is
    downloaded here) whose tokenizer maps every token to the id the student's does."""
    path = cfg.teacher.path
    if path is None or not cfg.algo.needs_teacher:
        return []
    folder = Path(path).expanduser()
    if not folder.exists() and not path.startswith((".", "/", "~")):
        log.info("teacher.path=%s: a hub id; its vocabulary is not checked before Ray starts", path)
        return []
    if not (folder / "config.json").is_file():
        return [
            f"teacher.path={path}: no HF model (config.json) in that directory; give the "
            "teacher's model folder, e.g. a GRPO run's run_dir/final"
        ]
    head = classification_head(folder)
    if head is not None:
        return [
            f"teacher.path={path}: its config.json names {head}, a sequence-classification "
            "head (a reward model: one score per sequence); the teacher gives a log-prob for "
            "each of the student's tokens, which takes a language-model head (...ForCausalLM), "
            "e.g. a GRPO run's run_dir/final"
        ]
    student, student_name = student_vocab(cfg)
    if student is None:
        return []
    teacher = tokenizer_vocab(str(folder))
    return vocab_problems(path, teacher, student, student_name)


def classification_head(folder: Path) -> str | None:
    """The ``...ForSequenceClassification`` class ``config.json`` lists, if any."""
    archs = json.loads((folder / "config.json").read_text()).get("architectures") or []
    return next((a for a in archs if a.endswith("ForSequenceClassification")), None)


def student_vocab(cfg: Config) -> tuple[dict[str, int] | None, str]:
    """The student's token -> id map and how to name it in a message; None where it
    cannot be read here (a hub id; the built-in vision-language model, whose
    tokenizer is assembled at build time)."""
    from rlpost.models.warmup import VL_PRESETS

    path = cfg.model.path
    if path is None:
        if cfg.model.preset in VL_PRESETS:
            return None, ""
        from rlpost.models.charset import builtin_tokenizer

        return dict(builtin_tokenizer(cfg.model.preset).get_vocab()), (
            f"the built-in {cfg.model.preset!r} model's"
        )
    if not (Path(path).expanduser() / "config.json").is_file():
        return None, ""
    return tokenizer_vocab(str(Path(path).expanduser())), f"model.path={path}'s"


def tokenizer_vocab(folder: str) -> dict[str, int]:
    """Every token of the folder's tokenizer, added tokens included, with its id."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return dict(tokenizer.get_vocab())


def vocab_problems(
    path: str, teacher: dict[str, int], student: dict[str, int], student_name: str
) -> list[str]:
    """One problem naming ``teacher.path`` when the two maps differ (a token missing
    on either side or under another id), with a few of the tokens that differ."""
    differ = sorted(
        (t for t in set(teacher) | set(student) if teacher.get(t) != student.get(t)),
        key=lambda t: (student.get(t, len(student)), t),
    )
    if not differ:
        return []

    def where(vocab: dict[str, int], token: str) -> str:
        return f"id {vocab[token]}" if token in vocab else "absent"

    shown = "; ".join(
        f"{t!r}: {where(student, t)} for the student, {where(teacher, t)} for the teacher"
        for t in differ[:SHOWN]
    )
    return [
        f"teacher.path={path}: its tokenizer's vocabulary ({len(teacher)} tokens) is not "
        f"{student_name} ({len(student)} tokens): {len(differ)} tokens differ ({shown}). The "
        "teacher scores the student's token ids, so both need one tokenizer: give a teacher "
        "of the student's model family (e.g. a run of the student's model, its run_dir/final), "
        "or change model.path to a student with the teacher's tokenizer"
    ]
