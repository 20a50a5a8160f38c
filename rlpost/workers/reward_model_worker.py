"""Ray shell around one reward model (``rlpost.rewards.reward_model``), on its own
placement bundle (role ``reward_model``)."""

from __future__ import annotations

from typing import Any

import ray
import torch

from rlpost.rewards.reward_model import SequenceRewardModel
from rlpost.workers import WORKER_ENV


class RewardModelWorker:
    def __init__(self, path: str, batch_size: int, max_length: int, dtype: str, threads: int):
        torch.set_num_threads(threads)
        self.model = SequenceRewardModel(path, batch_size, max_length, dtype)

    def ready(self) -> bool:
        return True

    def score(self, chats: list[list[dict]]) -> list[float]:
        return self.model.score(chats)


class RewardModelGroup:
    """The reward model's worker, started where ``scheduling`` places it;
    ``score`` blocks until its scores are back."""

    def __init__(
        self, model_cfg: Any, threads: int, device_opts: dict | None, scheduling: Any = None
    ):
        cls: Any = ray.remote(
            num_cpus=model_cfg.num_cpus, runtime_env={"env_vars": WORKER_ENV}, **(device_opts or {})
        )(RewardModelWorker)
        self.worker: Any = cls.options(scheduling_strategy=scheduling).remote(
            model_cfg.path, model_cfg.batch_size, model_cfg.max_length, model_cfg.dtype, threads
        )
        ray.get(self.worker.ready.remote())

    def score(self, chats: list[list[dict]]) -> list[float]:
        return ray.get(self.worker.score.remote(chats))

    def close(self) -> None:
        ray.kill(self.worker)
