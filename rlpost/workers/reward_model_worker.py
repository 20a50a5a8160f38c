"""Ray shell around one reward model (``rlpost.rewards.reward_model``), on its own
placement bundle (role ``reward_model``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ray
import torch

from rlpost.rewards.reward_model import SequenceRewardModel
from rlpost.workers import WORKER_ENV
from rlpost.workers.ray_types import ActorClass, ActorHandle, RayOptions, Scheduling

if TYPE_CHECKING:
    from rlpost.config.task_groups import RewardModelConfig


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
        self,
        model_cfg: RewardModelConfig,
        threads: int,
        device_opts: RayOptions | None,
        scheduling: Scheduling = None,
    ):
        cls: ActorClass = ray.remote(
            num_cpus=model_cfg.num_cpus, runtime_env={"env_vars": WORKER_ENV}, **(device_opts or {})
        )(RewardModelWorker)
        self.worker: ActorHandle = cls.options(scheduling_strategy=scheduling).remote(
            model_cfg.path, model_cfg.batch_size, model_cfg.max_length, model_cfg.dtype, threads
        )
        ray.get(self.worker.ready.remote())

    def score(self, chats: list[list[dict]]) -> list[float]:
        return ray.get(self.worker.score.remote(chats))

    def close(self) -> None:
        ray.kill(self.worker)
