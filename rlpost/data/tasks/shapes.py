"""Which colour is the shape: the built-in vision-language task.

A prompt is one user message holding an image and the question; the image is
a filled square, circle or triangle in one of four colours, at a random place
and size on a grey background, drawn with PIL. The expected completion is the
colour's name, followed by the model's end token. Held-out rows are other
drawings (other seeds) than the training rows.
"""

from __future__ import annotations

import base64
import io
import random
from dataclasses import dataclass
from typing import ClassVar

from rlpost.data.tasks.arith import correctness as _exact_answer

DATA_SOURCE = "shapes"
COLOURS = {"red": (220, 40, 40), "green": (40, 180, 60), "blue": (50, 70, 220), "yellow": (230, 210, 40)}  # fmt: skip
SHAPES = ("square", "circle", "triangle")
QUESTION = "Which colour is the shape?"


def draw(colour: str, shape: str, rng: random.Random, side: int) -> str:
    """A PNG data URI of ``shape`` in ``colour`` on grey, placed and sized by ``rng``."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (side, side), (128, 128, 128))
    pen = ImageDraw.Draw(image)
    size = rng.randint(side // 3, side - 8)
    x, y = rng.randint(0, side - size), rng.randint(0, side - size)
    box = (x, y, x + size, y + size)
    fill = COLOURS[colour]
    if shape == "square":
        pen.rectangle(box, fill=fill)
    elif shape == "circle":
        pen.ellipse(box, fill=fill)
    else:
        pen.polygon([(x, y + size), (x + size, y + size), (x + size // 2, y)], fill=fill)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@dataclass(frozen=True)
class ShapesTask:
    """``num_train`` training and ``num_val`` held-out drawings, all from ``seed``."""

    seed: int = 0
    num_val: int = 200
    num_train: int = 2000
    side: int = 56
    # the fields sft_rows depends on: held-out drawings come from a stream of their own
    SFT_FIELDS: ClassVar[tuple[str, ...]] = ("seed", "num_train", "side")

    def _rows(self, count: int, stream: int) -> list[dict]:
        rng = random.Random(self.seed * 1_000_003 + stream)
        rows = []
        for _ in range(count):
            colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
            rows.append(make_row(colour, draw(colour, shape, rng, self.side)))
        return rows

    def train_rows(self) -> list[dict]:
        return self._rows(self.num_train, stream=0)

    def val_rows(self) -> list[dict]:
        return self._rows(self.num_val, stream=1)

    def sft_rows(self) -> list[dict]:
        """Training rows whose assistant target is a colour name drawn at random,
        not the picture's: the built-in model's warm-up teaches the answer's form
        only, so it starts RL at chance (one colour in four) and RL has to teach
        it to read the picture."""
        rng = random.Random(self.seed * 1_000_003 + 2)
        names = sorted(COLOURS)
        return [{**row, "response": rng.choice(names)} for row in self.train_rows()]


def make_row(colour: str, image: str) -> dict:
    content = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    return {
        "prompt": [{"role": "user", "content": content}],
        "images": [image],
        "answer": colour,
        "data_source": DATA_SOURCE,
    }


def correctness(completion: str, row: dict) -> float:
    """1.0 when the completion, up to its end token, is the colour's name."""
    return _exact_answer(completion, row)


def reward(completion: str, row: dict) -> dict[str, float]:
    """Named rewards for the task: ``correctness`` alone."""
    return {"correctness": correctness(completion, row)}


reward.default_weights = {"correctness": 1.0}  # type: ignore[attr-defined]
