"""Images of vision-language data rows.

A row's prompt is chat messages whose content may hold image parts
(``{"type": "image"}``, as HF chat templates take them); its ``images`` list
gives the images in the order their parts appear. Each entry is one of:

- a file path (relative paths are relative to the data file's directory);
- base64 image bytes, bare or as a ``data:image/...;base64,`` URI;
- ``{"path": ...}`` or ``{"bytes": ...}`` (how HF ``datasets`` stores an image);
- a PIL image (rows built in Python, e.g. the built-in ``shapes`` task).
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image

IMAGE_PART_TYPES = ("image", "image_url")


def image_parts(messages: object) -> int:
    """How many image parts the messages' contents hold."""
    if not isinstance(messages, list):
        return 0
    count = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            count += sum(
                1 for p in content if isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES
            )
    return count


def check_images(row: dict) -> str | None:
    """Why the row's images do not fit its prompt, or None when they do."""
    images = row.get("images")
    parts = image_parts(row.get("prompt"))
    if images is None:
        return (
            f"the prompt has {parts} image part(s) but the row has no 'images'" if parts else None
        )
    if not isinstance(images, list):
        return f"'images' has type {type(images).__name__}, expected a list"
    if len(images) != parts:
        return (
            f"'images' holds {len(images)} image(s) but the prompt has {parts} image part(s) "
            "({'type': 'image'}); they must match one to one, in order"
        )
    return None


def resolve_paths(rows: list[dict], base_dir: Path) -> None:
    """Make relative image paths of ``rows`` relative to ``base_dir`` (in place)."""
    for row in rows:
        images = row.get("images") if isinstance(row, dict) else None
        if not isinstance(images, list):
            continue
        for i, ref in enumerate(images):
            if isinstance(ref, dict) and isinstance(ref.get("path"), str):
                ref = ref["path"]
            if isinstance(ref, str) and not ref.startswith("data:"):
                candidate = str(base_dir / ref)  # an absolute ref stays as it is
                if _is_file(candidate):
                    images[i] = candidate


def load_image(ref: object) -> Image.Image:
    """One ``images`` entry as an RGB PIL image; a clear ValueError when it is none."""
    from PIL import Image

    if isinstance(ref, Image.Image):
        return ref.convert("RGB")
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            return _open(ref["bytes"], "its 'bytes'")
        if ref.get("path") is not None:
            ref = ref["path"]
        else:
            raise ValueError(f"image {sorted(ref)}: expected a 'path' or 'bytes' key")
    if isinstance(ref, bytes):
        return _open(ref, "the bytes")
    if not isinstance(ref, str):
        raise ValueError(f"image of type {type(ref).__name__}: expected a path or base64 text")
    if ref.startswith("data:"):
        return _decode(ref.split(",", 1)[-1], ref[:40])
    if _is_file(ref):
        return _open(Path(ref).read_bytes(), ref)
    if "." in ref[-6:] or ref.startswith(("/", "./", "../")):  # names a file, e.g. x.png
        raise ValueError(f"image {ref}: no such file")
    return _decode(ref, ref[:40])


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff")


def missing_image_files(row: dict) -> list[str]:
    """The row's image references that name a file which is not there (paths
    already resolved against the data file's folder; base64 and data URIs are
    not file names)."""
    missing = []
    for ref in row.get("images") or []:
        if isinstance(ref, dict):
            ref = ref.get("path") if ref.get("bytes") is None else None
        if not isinstance(ref, str) or ref.startswith("data:") or len(ref) > 4096:
            continue
        looks_like_path = "/" in ref or ref.lower().endswith(IMAGE_SUFFIXES)
        if looks_like_path and not _is_file(ref):
            missing.append(ref)
    return missing


def row_images(row: dict) -> list[Image.Image] | None:
    """The row's images as PIL images (None for a text-only row)."""
    images = row.get("images")
    if not images:
        return None
    return [load_image(ref) for ref in images]


def _open(data: bytes, what: str) -> Image.Image:
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"image from {what}: not a readable image ({e})") from e
    return image.convert("RGB")


def _is_file(ref: str) -> bool:
    try:
        return Path(ref).is_file()
    except OSError:  # e.g. base64 text longer than a file name may be
        return False


def _decode(text: str, shown: str) -> Image.Image:
    try:
        data = base64.b64decode(text, validate=True)
    except binascii.Error as e:
        raise ValueError(f"image {shown}...: neither a file nor valid base64 ({e})") from e
    return _open(data, "the base64 data")
