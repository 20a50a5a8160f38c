"""Vision-language models without torchvision.

transformers 5 ships two backends of most image processors:
``image_processing_<model>`` (torchvision) and ``image_processing_pil_<model>``
(PIL and numpy). vLLM's model modules import the torchvision one by name, and
a processor that declares a video processor needs torchvision to build, save
or load one. Where torchvision cannot be imported (the package registries
hold only CUDA builds of it, which fail beside torch's CPU build),
``install()`` makes three changes in this process:

1. An import of a torchvision image-processor module that has a PIL twin
   gives the twin, with the class names the torchvision module would define
   (``Qwen2VLImageProcessor`` and ``...Fast`` are ``Qwen2VLImageProcessorPil``).
   Both backends produce the same ``pixel_values`` from the same image.
2. An import of a video-processor module gives a module whose classes refuse
   to be built: video needs torchvision.
3. A processor is built, saved and loaded without a video processor, and
   vLLM's profiling gets a stand-in that only answers its size questions;
   vLLM inspects model classes in this process (on the CPU), not in a fresh
   interpreter without the layer.

Call it before transformers or vLLM import a VL class (rlpost does, in every
process that builds a VL processor or engine). Where torchvision imports it
does nothing. Images work; videos do not.

A model directory rlpost writes (``run_dir/final``, ``python -m rlpost.export``)
loads in plain transformers without the layer when its processor has no video
processor (LLaVA, Gemma 3: the image processor falls back to its PIL twin by
itself). A processor that declares one (Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
InternVL) is built by ``AutoProcessor`` only with torchvision, whatever its
files say; ``load_hint`` is the line rlpost prints then.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from transformers.processing_utils import ProcessorMixin

_IMAGE_MODULE = re.compile(r"^transformers\.models\.(\w+)\.image_processing_(?!pil_)(\w+)$")
_VIDEO_MODULE = re.compile(r"^transformers\.models\.(?!auto\.)(\w+)\.video_processing_(\w+)$")
_installed = False
_vllm_patched = False


def torchvision_available() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # a CUDA build beside CPU torch fails at import with various errors
        return False
    return True


class NoVideo(dict):
    """A video processor that cannot process video; answers what vLLM's profiling reads.

    A ``dict`` (an empty one) so that a processor holding it serialises to JSON."""

    _auto_class = None  # what ProcessorMixin.save_pretrained asks of each part
    # vLLM reads the keyword arguments a part accepts from this class's annotations
    valid_kwargs = type("NoVideoKwargs", (), {})
    size = {"shortest_edge": 4096, "longest_edge": 16384}
    patch_size, temporal_patch_size, merge_size = 16, 2, 2
    fps, min_frames, max_frames = 2, 4, 8

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise ImportError("video input needs torchvision, which is not installed")

    def to_dict(self) -> dict:
        return {}

    @classmethod
    def from_pretrained(cls, *args: object, **kwargs: object) -> NoVideo:
        return cls()


def _unbuildable(name: str) -> type:
    def refuse(self: object, *args: object, **kwargs: object) -> NoReturn:
        raise ImportError(f"{name} needs torchvision, which is not installed")

    return type(name, (), {"__init__": refuse, "from_pretrained": classmethod(refuse)})


class _Loader(importlib.abc.Loader):
    def __init__(self, twin: str | None):
        self.twin = twin  # the PIL module to stand in, or None for a video module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        if self.twin is None:

            def missing(name: str) -> type:
                if name.startswith("__"):
                    raise AttributeError(name)
                return _unbuildable(name)

            setattr(module, "__getattr__", missing)  # noqa: B010  (PEP 562 module __getattr__)
            return
        pil = importlib.import_module(self.twin)
        public = {k: v for k, v in vars(pil).items() if not k.startswith("__")}
        module.__dict__.update(public)
        for name, value in public.items():
            if isinstance(value, type) and name.endswith("ImageProcessorPil"):
                base = name[: -len("Pil")]
                module.__dict__.setdefault(base, value)
                module.__dict__.setdefault(base + "Fast", value)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if _IMAGE_MODULE.match(fullname):
            package, _, leaf = fullname.rpartition(".")
            twin = f"{package}.{leaf.replace('image_processing_', 'image_processing_pil_', 1)}"
            if importlib.util.find_spec(twin) is None:
                return None  # no PIL twin: let the import fail as it would
            return importlib.util.spec_from_loader(fullname, _Loader(twin))
        if _VIDEO_MODULE.match(fullname):
            return importlib.util.spec_from_loader(fullname, _Loader(None))
        return None


def _patch_processors() -> None:
    """Processors take, save and load ``video_processor=None``."""
    from transformers import processing_utils

    mixin = processing_utils.ProcessorMixin
    check = mixin.check_argument_for_proper_class

    def check_or_none(self: ProcessorMixin, argument_name: str, argument: object) -> object:
        if argument is None or isinstance(argument, NoVideo):
            return None
        return check(self, argument_name, argument)

    setattr(mixin, "check_argument_for_proper_class", check_or_none)  # noqa: B010
    # Loading a processor resolves its video processor through this table.
    names = processing_utils._LazyAutoProcessorMapping._MAPPING_NAMES
    names["video_processor"] = (__name__, "NoVideo")


def _patch_vllm() -> None:
    """vLLM asks for a model's video processor while sizing its multimodal budget,
    and inspects a model class in a fresh interpreter (to keep CUDA out of this
    process), where this layer is not installed: on the CPU it inspects here."""
    try:
        from vllm.model_executor.models import registry
        from vllm.transformers_utils import processor
    except ImportError:
        return
    from rlpost.runtime import device as devices

    if not devices.is_available(devices.CUDA):
        registry._run_in_subprocess = lambda fn: fn()
    cached = processor.cached_video_processor_from_config

    # vLLM's arguments and its processor pass through unchanged
    def video_processor_or_none(*args: Any, **kwargs: Any) -> Any:
        try:
            return cached(*args, **kwargs)
        except (ImportError, AttributeError, TypeError):
            return NoVideo()

    processor.cached_video_processor_from_config = video_processor_or_none


def install(vllm: bool = False) -> bool:
    """Apply the layer once in this process (``vllm=True``: vLLM's part too, which
    imports vLLM); returns whether it is active."""
    global _installed, _vllm_patched
    if not _installed:
        if torchvision_available():
            return False
        sys.meta_path.insert(0, _Finder())
        _patch_processors()
        _installed = True
    if vllm and not _vllm_patched:
        _patch_vllm()
        _vllm_patched = True
    return True


def declares_video(model_dir: str | Path) -> bool:
    """Whether the processor saved in ``model_dir`` has a video processor (which
    transformers builds only with torchvision)."""
    import json

    d = Path(model_dir)
    config = d / "processor_config.json"
    declared = config.exists() and "video_processor" in json.loads(config.read_text())
    return declared or (d / "video_preprocessor_config.json").exists()


def load_hint(model_dir: str | Path) -> str | None:
    """What to call before ``AutoProcessor.from_pretrained(model_dir)`` in a process
    without torchvision, or None when plain transformers loads it here."""
    if not declares_video(model_dir) or torchvision_available():
        return None
    return (
        f"note: torchvision is not installed, so AutoProcessor.from_pretrained('{model_dir}') "
        "raises 'requires torchvision' (the processor declares a video processor); call "
        "`from rlpost.runtime.vl_compat import install; install()` before it (images work, "
        "video does not). The model, its tokenizer and AutoImageProcessor load without it."
    )
