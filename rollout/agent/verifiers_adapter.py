"""verifiers environments (``verifiers`` 0.4, ``import verifiers.v1 as vf``) as agent programs.

``agent.program=verifiers:<taskset>`` names a verifiers taskset as ``vf-eval`` does:
an installed package exporting its ``vf.Taskset`` subclass in ``__all__`` (``gsm8k``,
a Hub id ``owner/name@version``, or one built into verifiers: ``textarena``, ...),
or ``path/to/file.py``, a file that does the same. ``agent.env_kwargs`` is the rest of
verifiers' ``[env]`` block (``--env.*``): ``{taskset: {split: train}, agent: {harness:
{id: "null"}}}``. The environment is ``vf.load_environment`` of that config: the
taskset's own ``vf.Env`` subclass, else ``vf.SingleAgentEnv``.

Each episode is one ``Env.run_episode(task, ctx)``: verifiers launches the agent's
harness program in its runtime, which calls verifiers' interception server, which
forwards each request unchanged to rlpost's chat endpoint under the episode's key
(``vf.EvalClientConfig``), so the endpoint records the tokens as for any agent
program. The episode's reward is the trainable traces' rewards summed (the
task's ``@vf.reward`` functions, weighted); an episode verifiers marks failed
(a harness that exits non-zero, a reward that raises) raises, which rlpost
counts in ``agent/program_errors`` with reward 0.

Defaults that differ from ``vf-eval``'s, because the harness must reach rlpost's
endpoint on this machine: an agent whose ``runtime`` is not given runs in the
``subprocess`` runtime (verifiers' default is a remote Prime sandbox), and its
harness program gets an empty ``PYTHONPATH`` (it runs in its own ``uv``
environment, not the trainer's). The harness is verifiers' choice: the taskset's
bundled one, else ``bash``; a chat-only taskset wants ``agent: {harness: {id: "null"}}``.

Rows: ``data=verifiers`` makes one row per task of the taskset, in its order
(``verifiers_rows``); a row from ``data=files`` instead is built into the
taskset's task type from its columns (the ``vf.TaskData`` fields: ``prompt``,
``answer``, ...).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import shutil
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeGuard

from rlpost.rollout.agent.json_types import JSONObject
from rlpost.rollout.agent.specs import _load_file

if TYPE_CHECKING:
    from openai import AsyncOpenAI

# verifiers' own objects (its config, taskset, environment and episode results) are
# typed loosely: it is an optional package, and their attributes are read as
# verifiers 0.4 defines them.

PREFIX = "verifiers:"
EXTRA = "pip install 'rlpost[verifiers]'"
MODEL = "rlpost-policy"
IDX = "vf_idx"  # a data=verifiers row's task: its position in the taskset
# Episodes one interception server serves before it is replaced (once idle): each
# episode's key is a new client config, and the server keeps a client per config.
RECYCLE_EPISODES = 512


class VerifiersError(ValueError):
    """A verifiers spec, its ``agent.env_kwargs`` or its taskset cannot be used."""


def is_verifiers_spec(spec: str | None) -> TypeGuard[str]:
    return spec is not None and spec.startswith(PREFIX)


def _vf() -> ModuleType:
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise VerifiersError(f"needs the verifiers package, 0.4 ({exc}); {EXTRA}") from exc
    return vf


def taskset_id(spec: str) -> str:
    """The taskset id ``spec`` names; a file is imported now under its stem, so that
    verifiers' own loader finds it as a module."""
    target = spec.removeprefix(PREFIX)
    if not target:
        raise VerifiersError(
            f"{spec!r} names no taskset; use verifiers:<package or Hub id> or "
            "verifiers:path/to/file.py"
        )
    if not target.endswith(".py"):
        return target
    module = _load_file(spec, "verifiers taskset", Path(target), VerifiersError)
    stem = Path(target).stem
    other = sys.modules.get(stem)
    if other is not None and other is not module:
        if getattr(other, "__file__", None) != module.__file__:
            raise VerifiersError(
                f"{spec!r}: a module named {stem!r} is already imported from "
                f"{getattr(other, '__file__', '?')}; rename the file"
            )
    sys.modules[stem] = module
    return stem


def env_config(spec: str, env_kwargs: Mapping[str, object]) -> Any:
    """The verifiers ``EnvConfig`` of ``spec`` and ``agent.env_kwargs``, validated."""
    vf = _vf()
    ident = taskset_id(spec)
    raw: JSONObject = {k: _plain(v) for k, v in env_kwargs.items()}
    taskset = dict(raw.get("taskset") or {})
    if taskset.get("id", ident) != ident:
        raise VerifiersError(
            f"agent.env_kwargs.taskset.id={taskset['id']!r} differs from the spec's {ident!r}; "
            "drop it (the spec names the taskset)"
        )
    raw["taskset"] = {**taskset, "id": ident}
    if not raw.get("id"):  # the single-agent env: its seat's local defaults
        seat = dict(raw.get("agent") or {})
        seat.setdefault("runtime", {"type": "subprocess"})
        harness = dict(seat.get("harness") or {})
        try:
            harness.setdefault("id", vf.default_harness_id(ident))
        except Exception as exc:  # the taskset's import failed: say which spec
            raise VerifiersError(f"{spec!r}: {type(exc).__name__}: {exc}") from exc
        harness["env"] = {"PYTHONPATH": "", **(harness.get("env") or {})}
        seat["harness"] = harness
        raw["agent"] = seat
    try:
        return vf.resolve_env_config(raw)
    except Exception as exc:  # pydantic's message lists every bad field
        raise VerifiersError(f"{spec!r} with agent.env_kwargs={env_kwargs}: {exc}") from exc


def _plain(value: object) -> object:
    """OmegaConf containers as plain dicts and lists (pydantic validates those)."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def task_messages(data: Any) -> list[dict]:
    """A task's prompt as chat messages (its system prompt first)."""
    messages = [] if data.system_prompt is None else [
        {"role": "system", "content": data.system_prompt}
    ]  # fmt: skip
    if isinstance(data.prompt, str):
        return [*messages, {"role": "user", "content": data.prompt}]
    return [*messages, *(m.model_dump(exclude_none=True) for m in data.prompt or [])]


def verifiers_rows(spec: str, env_kwargs: dict, num_val: int) -> tuple[list[dict], list[dict]]:
    """``data=verifiers``: a row per task of the taskset, in its order; the held-out
    rows are its first ``num_val`` (a taskset has no standard held-out split: choose
    the tasks with its own config in ``agent.env_kwargs.taskset``)."""
    vf = _vf()
    config = env_config(spec, env_kwargs)
    try:
        taskset = vf.load_taskset(config.taskset)
        tasks = list(taskset if taskset.bounded else taskset.take(100_000))
    except Exception as exc:  # the taskset's load() raised
        raise VerifiersError(
            f"{spec!r}: loading its tasks raised {type(exc).__name__}: {exc}"
        ) from exc
    if not tasks:
        raise VerifiersError(f"{spec!r}: the taskset has no tasks")
    source = f"verifiers/{config.taskset.id}"
    rows = [
        {"prompt": task_messages(t.data), IDX: i, "data_source": source}
        for i, t in enumerate(tasks)
    ]
    return rows, rows[:num_val]


class _Loop:
    """The environment's own event loop, in a thread: its interception server lives
    across rlpost's batches (each runs on a loop of its own)."""

    def __init__(self, env: Any):
        self.env = env
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="verifiers").start()
        self.stack: contextlib.AsyncExitStack | None = None
        self.handed = self.running = 0
        self.idle: asyncio.Condition | None = None

    def submit(self, task: object, ctx: object) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(self._episode(task, ctx), self.loop)

    async def _episode(self, task: object, ctx: object) -> Any:
        if self.idle is None:
            self.idle = asyncio.Condition()
        async with self.idle:
            if self.stack is not None and self.handed >= RECYCLE_EPISODES:
                await self.idle.wait_for(lambda: self.running == 0)
                if self.stack is not None and self.handed >= RECYCLE_EPISODES:
                    await self.stack.aclose()
                    self.stack = None
            if self.stack is None:
                stack = contextlib.AsyncExitStack()
                await stack.enter_async_context(self.env.serving())
                self.stack, self.handed = stack, 0
            self.handed += 1
            self.running += 1
        try:
            return await self.env.run_episode(task, ctx)
        finally:
            async with self.idle:
                self.running -= 1
                self.idle.notify_all()


def _ensure_uv_on_path() -> None:
    """verifiers' runtimes run harness programs with ``uv`` from ``PATH``; the one
    pip installed beside this interpreter is not on it in a Ray worker."""
    if shutil.which("uv") is not None:
        return
    try:
        from uv import find_uv_bin

        found = Path(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return  # verifiers then installs uv itself, or says it cannot
    os.environ["PATH"] = os.pathsep.join([str(found.parent), os.environ.get("PATH", "")])


def load_verifiers_program(
    spec: str, env_kwargs: Mapping[str, object]
) -> Callable[[AsyncOpenAI, dict], Awaitable[float]]:
    """``async fn(client, row) -> reward``: one verifiers episode per call, its task the
    row's (``vf_idx``, or built from the row's columns), its model rlpost's endpoint
    under the client's key. Raises ``VerifiersError`` now for a bad spec or config."""
    vf = _vf()
    config = env_config(spec, env_kwargs)
    try:
        env = vf.load_environment(config)
    except Exception as exc:
        raise VerifiersError(
            f"{spec!r}: building its environment raised {type(exc).__name__}: {exc}"
        ) from exc
    _ensure_uv_on_path()
    state: dict[str, Any] = {}
    keys = itertools.count()

    def task_for(row: dict) -> object:
        if IDX in row:
            if "tasks" not in state:
                state["tasks"] = list(env.taskset)
            return state["tasks"][int(row[IDX])]
        task_cls = type(env.taskset).task_type()
        data_cls = task_cls.data_type()
        fields = {k: v for k, v in row.items() if k in data_cls.model_fields}
        return task_cls(data_cls(**fields), env.taskset.config.task)

    async def episode(client: AsyncOpenAI, row: dict) -> float:
        if "loop" not in state:
            state["loop"] = _Loop(env)
        task = task_for(row)
        # verifiers reads the API key from an environment variable, one per episode
        var = f"RLPOST_VF_KEY_{next(keys)}"
        os.environ[var] = client.api_key
        ctx = vf.ModelContext(
            model=MODEL,
            client=vf.EvalClientConfig(base_url=str(client.base_url), api_key_var=var),
        )
        try:
            result = await asyncio.wrap_future(state["loop"].submit(task, ctx))
        finally:
            os.environ.pop(var, None)
        if not result.ok:
            errors = [e for t in result.traces for e in t.errors] + list(result.errors)
            detail = "; ".join(f"{e.type}: {e.message[-300:]}" for e in errors) or "not ok"
            raise RuntimeError(f"the verifiers episode failed: {detail}")
        return float(sum(t.reward for t in result.traces if t.agent.trainable))

    episode.__name__ = f"verifiers[{config.taskset.id}]"
    return episode
