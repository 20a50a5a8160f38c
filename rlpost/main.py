"""``python -m rlpost.main [group=option ...] [key=value ...]``"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import NoReturn

USAGE = """usage: python -m rlpost.main [--config-dir DIR ...] [group=option ...] [key=value ...]

Groups and their presets (* the default):
{groups}
Config search path (the first folder that has a file wins):
{path}
Examples:
  python -m rlpost.main algo=grpo
  python -m rlpost.main trainer.total_steps=20 rollout.n=4 data.prompts_per_step=8
  python -m rlpost.main algo=grpo agent=calculator
  python -m rlpost.main model.path=Qwen/Qwen2.5-0.5B-Instruct data=files \\
      data.train_files=[train.jsonl] data.val_files=[val.jsonl] reward=custom reward.fn=my_reward.py:score
  python -m rlpost.main --config-dir my_configs algo=my_algo   # my_configs/algo/my_algo.yaml
Lists are written in brackets without spaces: trainer.logger=[console,jsonl].
Every key, its type and default: python -m rlpost.main --help-keys
Runs, curves, samples and a launch form in the browser: rlpost board --runs outputs
A Tinker-compatible training service for the tinker SDK: rlpost serve --port 8000
"""


def usage(user_dirs: list[str] | None = None) -> str:
    """``USAGE`` with every group's presets along the config search path
    (``user_dirs``, ``$RLPOST_CONFIG_DIR``, the shipped presets)."""
    import yaml

    from rlpost.config.compose import presets, search_path
    from rlpost.config.groups import GROUPS

    path = search_path(user_dirs or [])
    primary = next(folder / "config.yaml" for folder in path if (folder / "config.yaml").exists())
    root = yaml.safe_load(primary.read_text())
    chosen = {k: v for d in root["defaults"] if isinstance(d, dict) for k, v in d.items()}
    lines = []
    for group in GROUPS:
        marked = [f"{p}*" if p == chosen.get(group) else p for p in presets(group, path)]
        lines.append(f"  {group:8s} {', '.join(marked)}")
    folders = "\n".join(f"  {folder}" for folder in path)
    return USAGE.format(groups="\n".join(lines), path=folders)


def keys_table(overrides: list[str] | None = None) -> str:
    """Every key with its type, its value in the run ``overrides`` compose (the
    default run's without any) and its help text."""
    from rlpost.config.compose import compose, to_dict
    from rlpost.config.groups import SCHEMAS
    from rlpost.config.schema import describe

    defaults = to_dict(compose(overrides or []))
    rows = []
    for name, schema in SCHEMAS.items():
        for key, tp, text in describe(schema, name):
            value: object = defaults
            for part in key.split("."):
                value = value[part] if isinstance(value, dict) else None
            shown = repr(value) if isinstance(value, str) and "\n" in value else str(value)
            rows.append(f"{key:34s} {tp:40s} {shown:16s} {text}")
    return "\n".join([f"{'key':34s} {'type':40s} {'default':16s} meaning", *rows])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["board"]:  # ``rlpost board``: the web UI (rlpost/board)
        from rlpost.board.cli import main as board_main

        return board_main(argv[1:])
    if argv[:1] == ["serve"]:  # ``rlpost serve``: the Tinker-compatible service (rlpost/serve)
        from rlpost.serve.__main__ import main as serve_main

        return serve_main(argv[1:])
    from rlpost.config.compose import compose, split_config_dirs
    from rlpost.config.schema import ConfigError

    try:  # a bad --config-dir stops --help too, before anything starts
        user_dirs, rest = split_config_dirs(argv)
        if any(a in ("-h", "--help") for a in rest):
            print(usage(user_dirs))
            return 0
        if "--help-keys" in rest:
            print(keys_table([a for a in argv if a != "--help-keys"]))
            return 0
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from rlpost.data.rows import DataError
    from rlpost.loop.checkpoint import CheckpointError
    from rlpost.loop.faults import Interrupted, StopOnSignal
    from rlpost.result import RunError
    from rlpost.rewards.loading import RewardError
    from rlpost.trainers.files import UnsafeCheckpointError

    stop = StopOnSignal()
    try:
        cfg = compose(argv)
        from rlpost.run import train

        result = train(cfg, stop)
    except (ConfigError, DataError, RewardError, CheckpointError, UnsafeCheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:  # bad input was fine, the run itself went wrong
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:  # SIGINT / SIGTERM: checkpointed, workers and Ray stopped
        print(exc.advice(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        # The handler's Interrupted, re-raised by a blocking ray.get as a plain
        # KeyboardInterrupt: the same stop, told the same way.
        if stop.raised is None:
            raise
        interrupted = Interrupted(stop.raised, at_start=stop.raised_at_start)
        print(interrupted.advice(), file=sys.stderr)
        return interrupted.exit_code
    from rlpost.loop.tracking import first_and_last

    figure = first_and_last(result.history)  # the run's headline, as its plot and the board
    said = f"{figure[0]} {figure[1]:.3f} -> {figure[2]:.3f}; " if figure else ""
    print(f"done: {said}run dir {result.run_dir}; final model {result.final_model}")
    from rlpost.runtime.vl_compat import load_hint

    hint = load_hint(result.final_model) if result.final_model else None
    if hint:  # a VL processor that plain transformers builds only with torchvision
        print(hint)
    return 0


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` once ``main`` has returned, without the
    interpreter's teardown.

    By then the run has written and closed everything and stopped Ray; what is
    left of shutting Python down is freeing the modules it imported (torch,
    transformers, Ray, vLLM's), 1.7 s after a one-step run's 23 s. The exit
    handlers still run (logging's flush among them). A thread that is not a
    daemon, which the interpreter would wait for, makes it exit the usual way.
    """
    if any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


def cli() -> NoReturn:
    """The ``rlpost`` command."""
    exit_now(main())


if __name__ == "__main__":
    cli()
