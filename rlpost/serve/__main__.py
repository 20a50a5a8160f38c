"""``python -m rlpost.serve`` (``rlpost serve``): start the Tinker-compatible service.

    rlpost serve                                  # the built-in model, on 127.0.0.1:8000
    rlpost serve --model Qwen/Qwen3-0.6B=/models/qwen3-0.6b --port 8001
    rlpost serve --model Qwen/Qwen3-0.6B     # from the Hugging Face cache, offline
    rlpost serve --model Qwen/Qwen3-0.6B=/models/qwen3-0.6b --hf-cache
                                     # and its tokenizer in the cache as Qwen/Qwen3-0.6B

Then, in Python: ``tinker.ServiceClient(base_url="http://127.0.0.1:8000")`` with
``TINKER_API_KEY=tml-<anything>`` (the SDK takes keys that start with ``tml-``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

BUILTIN = "rlpost/tiny-arith"


def builtin_model() -> str:
    """The built-in base (the pre-warmed arithmetic model shipped with rlpost)."""
    from rlpost.config import compose
    from rlpost.models.warmup import SHIPPED_DIR, cache_root, install_shipped, warmup_key

    cfg = compose(["algo=grpo"])
    out = cache_root(cfg) / warmup_key(cfg)
    if (out / "config.json").exists():
        return str(out)
    if (SHIPPED_DIR / out.name / "config.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        return install_shipped(SHIPPED_DIR / out.name, out)
    raise SystemExit("rlpost serve: the built-in model is not installed; pass --model NAME=PATH")


def cached_model(name: str) -> str:
    """The folder of ``name`` (``org/model``) in the local Hugging Face cache.

    Nothing is downloaded: the service starts from what is on disk, so a name that
    the cache lacks is an error saying how to fetch it or to pass a folder.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = snapshot_download(name, local_files_only=True)
    except (LocalEntryNotFoundError, ValueError, OSError) as e:
        raise SystemExit(f"rlpost serve: --model {name!r} is not a model folder and not in the "
                         "Hugging Face cache (HF_HOME / HF_HUB_CACHE); fetch it with "
                         f"`hf download {name}`, or pass NAME=PATH to a folder ({e.__class__.__name__})") from None  # fmt: skip
    if not (Path(path) / "config.json").is_file():
        raise SystemExit(f"rlpost serve: --model {name!r}: the cached snapshot {path} holds no "
                         "config.json; download the whole model, or pass NAME=PATH")  # fmt: skip
    return path


def parse_models(specs: list[str]) -> dict[str, str]:
    """``NAME=PATH``, a model folder (served under its folder name), or a cached hub name."""
    models: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            folder = Path(spec).expanduser()
            if folder.is_dir():
                name, path = folder.resolve().name, str(folder)
            else:
                name, path = spec, cached_model(spec)
        if not name or not path:
            raise SystemExit(f"rlpost serve: --model {spec!r}: write NAME=PATH (the name clients "
                             "ask for, e.g. Qwen/Qwen3-0.6B, and a Hugging Face model folder), "
                             "a folder, or a model name in the Hugging Face cache")  # fmt: skip
        if not (Path(path) / "config.json").is_file():
            raise SystemExit(f"rlpost serve: --model {spec!r}: {path} holds no config.json; point "
                             "it at a Hugging Face model folder")  # fmt: skip
        if name in models:
            raise SystemExit(f"rlpost serve: --model {spec!r}: {name!r} is served twice; give "
                             "each model its own NAME=PATH")  # fmt: skip
        models[name] = path
    return models


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rlpost serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: localhost)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", action="append", default=[], metavar="NAME=PATH",
                   help="serve the model folder PATH as NAME; a folder alone is served under "
                   "its folder name, a hub name alone (org/model) from the local Hugging Face "
                   f"cache (repeatable; default: the built-in model as {BUILTIN})")  # fmt: skip
    p.add_argument("--state-dir", default=os.path.expanduser("~/.cache/rlpost/serve"),
                   help="where checkpoints are kept")  # fmt: skip
    p.add_argument("--api-key", default=os.environ.get("RLPOST_SERVE_API_KEY"),
                   help="the one key accepted (X-API-Key); required with a --host other than "
                   "localhost (default: $RLPOST_SERVE_API_KEY; on localhost any key)")  # fmt: skip
    p.add_argument(
        "--device", default=None, help="cpu, cuda or npu (default: the accelerator present)"
    )
    p.add_argument(
        "--sampler", choices=("model", "vllm"), default="model",
        help="model (default): the served model samples itself, each sampler snapshot an "
        "adapter of its own; vllm: a vLLM engine samples, each snapshot a LoRA adapter (a "
        "tenant that trains the unembedding is still sampled by the model)",
    )  # fmt: skip
    p.add_argument(
        "--hf-cache", action="store_true",
        help="also put each served model's tokenizer in the local Hugging Face cache under "
        "its NAME (org/model), so that a client on this machine (the tinker cookbook's "
        "get_tokenizer, with HF_HUB_OFFLINE=1) loads it by that name offline; a name the "
        "cache already holds is left as it is",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        raise SystemExit("rlpost serve: listening on a non-local address needs --api-key (or "
                         "RLPOST_SERVE_API_KEY); clients send it as TINKER_API_KEY")  # fmt: skip
    if args.api_key is not None and not args.api_key.startswith("tml-"):
        raise SystemExit("rlpost serve: --api-key must start with 'tml-' (the tinker SDK "
                         "refuses other keys)")  # fmt: skip
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    models = parse_models(args.model) or {BUILTIN: builtin_model()}
    if args.hf_cache:
        from rlpost.serve.hub_cache import register_tokenizer

        for name, path in models.items():
            try:
                snapshot = register_tokenizer(name, path)
            except ValueError as e:
                raise SystemExit(f"rlpost serve: {e}") from None
            said = f"in {snapshot}" if snapshot else "already in the cache, left as it is"
            print(f"rlpost serve: the tokenizer of {name} {said}", flush=True)

    from aiohttp import web

    from rlpost.runtime import device as devices
    from rlpost.serve.app import Service
    from rlpost.serve.host import ModelHost

    device = args.device or devices.detect()
    state = Path(args.state_dir)
    sampler = args.sampler
    hosts = {name: ModelHost(name, path, state, device, sampler) for name, path in models.items()}
    service = Service(hosts, state, args.api_key)
    print(f"rlpost serve: {', '.join(models)} on http://{args.host}:{args.port} "
          f"(checkpoints in {state}; sampling by {sampler})", flush=True)  # fmt: skip
    web.run_app(service.app(), host=args.host, port=args.port, print=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
