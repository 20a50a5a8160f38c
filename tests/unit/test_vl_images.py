"""Images of VL data rows: every accepted form loads the same pixels, a wrong one
says what is wrong, and image parts must match the images one to one."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image

from rlpost.data.images import load_image, row_images
from rlpost.data.rows import PromptStream, load_rows, validate_row

PROMPT = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]


def _png(colour=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buf, format="PNG")
    return buf.getvalue()


def test_every_accepted_form_gives_the_same_pixels(tmp_path):
    data = _png()
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "red.png").write_bytes(data)
    b64 = base64.b64encode(data).decode()
    rows = [
        {"prompt": PROMPT, "images": ["imgs/red.png"]},  # relative to the data file
        {"prompt": PROMPT, "images": [str(tmp_path / "imgs" / "red.png")]},
        {"prompt": PROMPT, "images": [b64]},
        {"prompt": PROMPT, "images": ["data:image/png;base64," + b64]},
        {"prompt": PROMPT, "images": [{"bytes": data, "path": None}]},
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r, default=lambda b: None) for r in rows[:4]) + "\n")
    loaded = load_rows(path) + rows[4:]
    assert all(validate_row(r) is None for r in loaded)
    pixels = [row_images(r)[0].getpixel((3, 3)) for r in loaded]
    assert pixels == [(200, 30, 30)] * 5


def test_a_bad_image_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_image(str(tmp_path / "missing.png"))
    with pytest.raises(ValueError, match="not a readable image"):
        load_image(base64.b64encode(b"not an image" * 40).decode())
    with pytest.raises(ValueError, match="neither a file nor valid base64"):
        load_image("#" * 300)


def test_image_parts_and_images_must_match():
    assert "no 'images'" in validate_row({"prompt": PROMPT})
    two = {"prompt": PROMPT, "images": ["a.png", "b.png"]}
    assert "holds 2 image(s) but the prompt has 1" in validate_row(two)
    # such rows are dropped and counted, like any malformed row
    stream = PromptStream([two, {"prompt": "2+2="}], seed=0, batch_size=1)
    assert stream.num_malformed == 1
