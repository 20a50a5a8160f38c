"""The built-in models on a user's data: the warm-up task suits the preset, a warm-up
short of its target says so, the run says it trains a toy, the cache key holds only
what changes the model, and the characters the built-in tokenizer drops are counted."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from rlpost.config.compose import compose
from rlpost.data.tasks import ShapesTask, build_task
from rlpost.models.charset import check_builtin_charset, count_dropped_chars, model_text
from rlpost.models.tiny import build_tokenizer
from rlpost.models.warmup import (
    WARMUP_RECORD,
    builtin_model,
    warmup_key,
    warmup_task,
    warmup_task_args,
)

FILES = ["data=files", "data.train_files=[train.jsonl]", "data.val_files=[val.jsonl]"]
CPU = ["trainer.device=cpu"]


def test_a_vl_preset_warms_up_on_the_vl_task_whatever_the_data():
    assert warmup_task(compose(CPU + ["model=tiny_vl", *FILES])) == "shapes"
    assert warmup_task(compose(CPU + ["model=tiny_vl", "data=arith"])) == "shapes"
    assert warmup_task(compose(CPU + ["data=shapes"])) == "shapes"
    # text presets keep their warm-up: the run's own task, arith for user files
    assert warmup_task(compose(CPU + FILES)) == "arith"
    assert warmup_task(compose(CPU + ["agent=calculator"])) == "calc"
    assert warmup_task(compose(CPU)) == "arith"


def test_keys_that_cannot_change_the_model_stay_out_of_its_cache_key():
    # user files: the warm-up task is built with its defaults, so data.* keys meant
    # for the files are not in its arguments and not in the key
    for preset in ("tiny", "tiny_vl"):
        base = compose(CPU + [f"model={preset}", *FILES])
        for change in ("data.val_size=50", "data.max_operand=9"):
            other = compose(CPU + [f"model={preset}", *FILES, change])
            assert warmup_key(other) == warmup_key(base), (preset, change)
    # ... but the task's own defaults, the built-in run's: one base for both runs
    assert warmup_task_args(compose(CPU + FILES)) == {"seed": 0, "max_operand": 99, "num_val": 200}
    assert warmup_key(compose(CPU + FILES)) == warmup_key(compose(CPU))
    # shapes: held-out drawings come from their own stream, so val_size is not trained on
    shapes = compose(CPU + ["data=shapes"])
    assert warmup_key(compose(CPU + ["data=shapes", "data.val_size=50"])) == warmup_key(shapes)
    # arith: the held-out pairs are left out of the warm-up's rows, so val_size is in
    arith = compose(CPU + ["data.val_size=50"])
    assert warmup_key(arith) != warmup_key(compose(CPU))
    assert warmup_task_args(arith) == {"seed": 0, "max_operand": 99, "num_val": 50}
    # the seed changes every task's rows and weights
    assert warmup_key(compose(CPU + [*FILES, "trainer.seed=1"])) != warmup_key(compose(CPU + FILES))


def test_each_task_declares_the_fields_its_warmup_rows_depend_on():
    small = ShapesTask(num_train=12, num_val=3)
    assert ShapesTask(num_train=12, num_val=30).sft_rows() == small.sft_rows()
    assert ShapesTask(num_train=12, num_val=3, seed=1).sft_rows() != small.sft_rows()
    assert "num_val" not in ShapesTask.SFT_FIELDS
    for name in ("arith", "calc"):
        rows = build_task(name, max_operand=20, num_val=10).sft_rows()
        assert build_task(name, max_operand=20, num_val=11).sft_rows() != rows
        assert "num_val" in build_task(name).SFT_FIELDS


class FakeTrainer:
    """A warm-up trainer whose greedy answers never match: accuracy 0 throughout."""

    def __init__(self) -> None:
        self.updates = 0

    def update_sft(self, batch):
        self.updates += 1
        return {"sft/nll": 1.0}

    def greedy_match(self, batch):
        return torch.zeros(4)

    def save_hf(self, out: str) -> None:
        Path(out).mkdir(parents=True)
        (Path(out) / "config.json").write_text("{}")

    def close(self) -> None:
        pass


def test_a_warmup_short_of_its_target_warns_with_the_figures(tmp_path, caplog):
    cfg = compose(
        CPU + FILES + [f"model.cache_dir={tmp_path}", "model.preset=micro"]
        + ["model.warmup.steps=5", "model.warmup.eval_every=2", "model.warmup.target_accuracy=0.5"]
    )  # fmt: skip
    trainer = FakeTrainer()
    with caplog.at_level(logging.WARNING, logger="rlpost.models.warmup"):
        out = builtin_model(cfg, lambda path, lr, warm: trainer)
    assert trainer.updates == 5  # accuracy 0 never reaches 0.5: every step runs
    record = json.loads((Path(out) / WARMUP_RECORD).read_text())
    assert record == {
        "task": "arith", "steps": 5, "max_steps": 5, "accuracy": 0.0, "target_accuracy": 0.5
    }  # fmt: skip
    messages = [r.getMessage() for r in caplog.records]
    # one line at start that this is a toy warmed up on arith, and how to pass one's own
    toy = [m for m in messages if "toy model" in m]
    assert len(toy) == 1 and "built-in arith task" in toy[0] and "model.path=" in toy[0]
    short = [m for m in messages if "reached train accuracy" in m]
    assert len(short) == 1
    assert "0.000 of its target 0.500 after 5 steps" in short[0]
    assert "model.warmup.steps (now 5)" in short[0] and "model.path=" in short[0]
    # the cached model says so again, without a new warm-up
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlpost.models.warmup"):
        assert builtin_model(cfg, lambda *a: FakeTrainer()) == out
    assert sum("reached train accuracy" in r.getMessage() for r in caplog.records) == 1


def test_characters_the_builtin_tokenizer_cannot_encode_are_counted():
    tok = build_tokenizer()
    # printable ASCII and newlines round-trip; a tab, "é" and "—" have no token
    assert tok.decode(tok.encode("a+b=\n~", add_special_tokens=False)) == "a+b=\n~"
    assert tok.decode(tok.encode("\té—", add_special_tokens=False)) == ""
    rows = [
        {"prompt": "café\tau lait", "answer": "ü"},  # é, \t: 2 (the answer is the reward's)
        {"prompt": "plain"},
        {"prompt": [{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": "naïve — naïve"},
        ]}], "images": ["é.png"]},  # ï, —, ï: 3
    ]  # fmt: skip
    dropped, chars, first, affected = count_dropped_chars({"train.jsonl": rows}, tok)
    assert (dropped, first, affected) == (5, "train.jsonl row 0", 2)
    assert chars == {"é": 1, "\t": 1, "ï": 2, "—": 1}
    # an SFT chat counts its turns once, not again as its derived prompt
    chat = {"messages": [{"role": "user", "content": "é"}], "prompt": [{"content": "é"}]}
    assert list(model_text(chat)) == ["é"]


def test_the_run_on_files_warns_once_and_a_model_of_ones_own_is_not_checked(caplog):
    train = [{"prompt": "plain"}, {"prompt": "ça va"}, {"prompt": "ça"}]
    val = [{"prompt": "ok"}]
    with caplog.at_level(logging.WARNING, logger="rlpost.models.charset"):
        assert check_builtin_charset(compose(CPU + FILES), train, val) == 2
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("train.jsonl row 1: the built-in tiny model's tokenizer")
    assert "'ç'" in message and "2 characters in 2 of 4 rows" in message
    assert "data/dropped_chars" in message and "model.path=" in message
    assert check_builtin_charset(compose(CPU + [*FILES, "model.path=/m"]), train, val) == 0
    # the byte-level tokenizer of the built-in VL model encodes any text
    assert check_builtin_charset(compose(CPU + ["model=tiny_vl", *FILES]), train, val) == 0


def test_two_runs_warming_the_same_entry_at_once_do_not_clobber_each_other(tmp_path):
    """Two experiments started together build the same cache entry: each warms its own
    initial copy (the real trainer reads its tokenizer back from it when saving), so
    the one finishing first no longer deletes the other's."""
    import threading

    cfg = compose(CPU + FILES + [f"model.cache_dir={tmp_path}", "model.preset=micro"]
                  + ["model.warmup.steps=2", "model.warmup.eval_every=1"])  # fmt: skip
    second_done = threading.Event()

    class ReadsItsInitDir(FakeTrainer):
        """FakeTrainer whose save copies a file from the folder it was built on; the
        first build's waits at its first step until the second build has closed."""

        def __init__(self, path: str, waits: bool) -> None:
            super().__init__()
            self.path, self.waits = Path(path), waits

        def update_sft(self, batch):
            if self.waits and self.updates == 0:
                assert second_done.wait(timeout=60)
            return super().update_sft(batch)

        def save_hf(self, out: str) -> None:  # atomically, as the engine's
            from rlpost.trainers.files import atomic_directory

            with atomic_directory(out) as tmp:
                (tmp / "config.json").write_text("{}")
                tokenizer = (self.path / "tokenizer_config.json").read_text()
                (tmp / "tokenizer_config.json").write_text(tokenizer)

        def close(self) -> None:
            if not self.waits:
                second_done.set()

    results, errors = {}, []

    def build(name: str, waits: bool) -> None:
        try:
            results[name] = builtin_model(cfg, lambda path, lr, w: ReadsItsInitDir(path, waits))
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    first = threading.Thread(target=build, args=("first", True))
    first.start()
    while not list(tmp_path.glob("*.init*")):  # the first build's initial copy exists
        threading.Event().wait(0.01)
    build("second", False)
    first.join(timeout=60)
    assert errors == [] and results["first"] == results["second"]
    assert (Path(results["first"]) / "tokenizer_config.json").exists()
    assert not list(tmp_path.glob("*.init*"))  # both initial copies are gone
