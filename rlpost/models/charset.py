"""Which characters of a user's rows the built-in model's tokenizer cannot encode.

The built-in text models' tokenizer (``rlpost.models.tiny``) has one token per
printable ASCII character and newline and no unknown token: ``encode`` drops any
other character (a tab, "é", "—") without a trace, so the model would read a
user's text with letters missing. A run on data files with the built-in model
counts those characters (``data/dropped_chars``) before Ray starts and warns
once, naming a row and the characters.
"""

from __future__ import annotations

import logging
import unicodedata
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from rlpost.config.groups import Config

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

log = logging.getLogger(__name__)
SHOWN = 8  # distinct characters the warning names


def builtin_tokenizer(preset: str) -> PreTrainedTokenizerFast:
    """The tokenizer the built-in model ``preset`` is built with."""
    from rlpost.models.warmup import VL_PRESETS

    if preset in VL_PRESETS:  # the VL tokenizers add special tokens only
        from rlpost.models.archs import build_tokenizer as build_vl_base

        return build_vl_base()
    from rlpost.models.tiny import build_tokenizer

    return build_tokenizer()


def model_text(row: object) -> Iterator[str]:
    """The strings of ``row`` that the model reads: its prompt, its SFT ``response``
    and ``messages``, the text parts of multimodal contents (not roles, not images,
    not the columns only the reward sees)."""
    if not isinstance(row, dict):
        return
    # An SFT chat's prompt is its own first turns (rlpost.plan.inputs.sft_row).
    keys = ("messages",) if isinstance(row.get("messages"), list) else ("prompt", "response")
    for key in keys:
        value = row.get(key)
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            for message in value:
                content = message.get("content") if isinstance(message, dict) else None
                if isinstance(content, str):
                    yield content
                elif isinstance(content, list):
                    for part in content:
                        if isinstance(part, dict) and isinstance(part.get("text"), str):
                            yield part["text"]


class Coverage:
    """``dropped(text)``: the characters of ``text`` that ``tokenizer`` cannot encode,
    each one's fate found once by a round trip (``decode(encode(c)) != c``; NFC
    normalisation is not a loss)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.known: dict[str, bool] = {}

    def encodes(self, char: str) -> bool:
        if char not in self.known:
            ids = self.tokenizer.encode(char, add_special_tokens=False)
            decoded = self.tokenizer.decode(ids)
            self.known[char] = decoded == unicodedata.normalize("NFC", char)
        return self.known[char]

    def dropped(self, text: str) -> Counter[str]:
        return Counter(c for c in text if not self.encodes(c))


def count_dropped_chars(
    rows: dict[str, list[dict]], tokenizer: PreTrainedTokenizerBase
) -> tuple[int, Counter[str], str | None, int]:
    """Over ``rows`` (a name such as ``data.train_files`` -> its rows): the number of
    characters ``tokenizer`` drops, each dropped character's count, the first row
    with one (``"<name> row <i>"``) and the number of rows with one."""
    coverage = Coverage(tokenizer)
    total: Counter[str] = Counter()
    first, affected = None, 0
    for name, part in rows.items():
        for i, row in enumerate(part):
            lost: Counter[str] = Counter()
            for text in model_text(row):
                lost += coverage.dropped(text)
            if lost:
                affected += 1
                total += lost
                first = first or f"{name} row {i}"
    return sum(total.values()), total, first, affected


def check_builtin_charset(cfg: Config, train_rows: list[dict], val_rows: list[dict]) -> int:
    """Characters of the data files' rows that the built-in model's tokenizer drops
    (0 with ``model.path`` or a built-in task); warns once with an example."""
    if cfg.model.path or cfg.data.name != "files":
        return 0

    def name(key: str, files: list[str]) -> str:
        return files[0] if len(files) == 1 else f"data.{key}"

    rows = {
        name("train_files", cfg.data.train_files): train_rows,
        f"{name('val_files', cfg.data.val_files)} (held out)": val_rows,
    }
    dropped, chars, first, affected = count_dropped_chars(rows, builtin_tokenizer(cfg.model.preset))
    if dropped:
        shown = ", ".join(repr(c) for c, _ in chars.most_common(SHOWN))
        more = f" and {len(chars) - SHOWN} more" if len(chars) > SHOWN else ""
        log.warning(
            "%s: the built-in %s model's tokenizer cannot encode %s%s and drops them: %d "
            "characters in %d of %d rows (data/dropped_chars), so the model reads your "
            "text with them missing. Pass "
            "model.path=<a Hugging Face model directory> whose tokenizer covers your text, "
            "or replace those characters in the data",
            first, cfg.model.preset, shown, more, dropped, affected,
            len(train_rows) + len(val_rows),
        )  # fmt: skip
    return dropped
