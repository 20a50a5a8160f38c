"""The shapes task: seeded drawings whose answer is the shape's colour."""

from __future__ import annotations

from rlpost.data.images import row_images
from rlpost.data.rows import validate_row
from rlpost.data.tasks import build_task
from rlpost.data.tasks.shapes import COLOURS, reward


def test_rows_are_seeded_valid_and_show_their_colour():
    task = build_task("shapes", seed=0, num_val=20, max_operand=99)  # max_operand: not its field
    rows = task.val_rows()
    assert rows == build_task("shapes", seed=0, num_val=20).val_rows()
    assert rows != build_task("shapes", seed=1, num_val=20).val_rows()
    assert all(validate_row(r) is None for r in rows)
    assert {r["answer"] for r in rows} <= set(COLOURS)
    for row in rows:
        image = row_images(row)[0]
        assert image.size == (56, 56)
        # the shape covers at least (56 / 3)^2 / 2 pixels in its colour; the rest is grey
        count = sum(1 for px in image.getdata() if px == COLOURS[row["answer"]])
        assert count >= (56 // 3) ** 2 // 2, (row["answer"], count)
    train = {r["images"][0] for r in task.train_rows()}
    assert not train & {r["images"][0] for r in rows}  # held-out drawings are new


def test_reward_is_the_exact_colour_name():
    row = {"answer": "red"}
    assert reward("red", row) == {"correctness": 1.0}
    assert reward(" red<|im_end|>", row) == {"correctness": 1.0}
    assert reward("reddish", row) == {"correctness": 0.0}
