"""``build_plan(cfg)``: every check of what the config names, reported together
as one config error, and everything the run derives from the config, derived
here once. Nothing in it starts Ray or loads a model's weights."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from rlpost.config.compose import to_dict
from rlpost.config.groups import Config
from rlpost.config.schema import ConfigError
from rlpost.data.rows import DataError
from rlpost.device import DeviceSpec
from rlpost.models.charset import check_builtin_charset
from rlpost.plan.algo import AlgoSettings, algo_settings
from rlpost.plan.checks import (
    check_agent,
    check_device,
    check_lora_adapter,
    check_megatron_model,
    check_model_length,
    check_model_path,
    check_ulysses_model,
)
from rlpost.plan.engines import rollout_engine_config, trainer_engine_config
from rlpost.plan.inputs import drop_long_prompts, load_data
from rlpost.plan.packages import check_companions
from rlpost.plan.pd_prompts import check_pd_prompts
from rlpost.plan.teacher import check_teacher
from rlpost.rewards.combine import (
    build_scorer,
    check_names,
    merged_weights,
    reward_name,
    reward_specs,
)
from rlpost.rewards.judge import build_parser, check_template
from rlpost.rewards.loading import RewardError, RewardFn, load_reward_fn
from rlpost.rewards.reward_model import check_model_folder, check_reward_model
from rlpost.rewards.scoring import call_plan

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlpost.plan.engines import RolloutEngineConfig
    from rlpost.rewards.combine import RewardSet
    from rlpost.rewards.scoring import RewardScorer, Scorer
    from rlpost.trainers.fsdp import FSDPEngineConfig
    from rlpost.trainers.megatron.config import MegatronEngineConfig

log = logging.getLogger(__name__)
ROLES = ("policy", "reference", "teacher", "critic")


@dataclass
class RunPlan:
    """What a run needs, resolved from its config. ``malformed_rows`` counts the
    rows dropped as unusable (``data/malformed_rows``); the workers' engine
    configs come from ``trainer_engine`` and ``rollout_engine`` once the model
    path is known (the built-in model is warmed up after Ray starts)."""

    cfg: Config
    device: DeviceSpec
    reward_fns: list[RewardFn]  # one per spec of reward.fn, in its order
    train_rows: list[dict]
    val_rows: list[dict]
    malformed_rows: int
    algo: AlgoSettings
    long_prompts: int = 0  # prompts dropped for data.max_prompt_tokens (fit_prompts)
    dropped_chars: int = 0  # characters the built-in tokenizer drops (data/dropped_chars)

    @property
    def roles(self) -> tuple[str, ...]:
        """The trainer groups the algorithm needs. Under LoRA the reference is the
        policy with its adapter disabled: no group of its own. ``algo=opd``'s teacher
        is a frozen group of its own model (``teacher.path``), placed like the
        reference."""
        a, lora = self.cfg.algo, self.cfg.model.lora.rank > 0
        wanted = {"policy": True, "reference": a.needs_reference and not lora}
        wanted["teacher"] = a.needs_teacher
        wanted["critic"] = a.needs_critic
        return tuple(r for r in ROLES if wanted[r])

    def engine_kind(self, role: str) -> str:
        """The engine trainer group ``role`` holds: ``algo=rm``'s policy group is the
        reward model being trained (``rlpost.trainers.registry``)."""
        if role == "critic":
            return "critic"
        return "reward_model" if self.cfg.algo.name == "rm" else "policy"

    def trainer_engine(
        self, role: str, model_path: str, cfg: Config | None = None
    ) -> FSDPEngineConfig | MegatronEngineConfig:
        """The engine config of trainer group ``role`` (``cfg``: the warm-up's own); the
        teacher's model is ``teacher.path``, not the student's ``model_path``."""
        if role == "teacher":
            assert self.cfg.teacher.path is not None
            model_path = self.cfg.teacher.path
        return trainer_engine_config(cfg or self.cfg, role, model_path, self.device)

    @property
    def reward_specs(self) -> list[str]:
        return reward_specs(self.cfg.reward.fn)

    def scorer(self, extra: list[tuple[str, Scorer]] | None = None) -> RewardScorer | RewardSet:
        """The scorer of ``reward.*`` (``RewardScorer``, or a ``RewardSet`` of several
        functions and the ``extra`` named members, a reward model's); its reward
        worker processes start on its first call."""
        return build_scorer(self.reward_specs, self.reward_fns, self.cfg.reward, extra or [])

    def rollout_engine(self, model_path: str) -> RolloutEngineConfig:
        return rollout_engine_config(self.cfg, model_path, self.device.kind)

    def fit_prompts(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Drop the data files' prompts longer than ``data.max_prompt_tokens`` once the
        tokenizer is known (the built-in task's prompts are short by construction)."""
        if self.cfg.data.name != "files":
            return
        limit = self.cfg.data.max_prompt_tokens
        self.train_rows, too_long = drop_long_prompts(self.train_rows, tokenizer, limit)
        self.val_rows, too_long_val = drop_long_prompts(self.val_rows, tokenizer, limit)
        self.long_prompts = too_long + too_long_val

    def make_run_dir(self) -> Path:
        """``trainer.run_dir`` (or a new one under ``outputs/``) with the config in it."""
        cfg = self.cfg
        if cfg.trainer.run_dir:
            path = Path(cfg.trainer.run_dir)
        else:
            path = Path("outputs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.algo.name}"
        path.mkdir(parents=True, exist_ok=True)
        with open(path / "config.yaml", "w") as f:
            yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
        return path.resolve()


def check_judge(cfg: Config, specs: list[str], columns: set[str]) -> list[str]:
    """``reward.judge``: its folder, its template's fields and its parser."""
    j = cfg.reward.judge
    if j.path is None:
        return []
    problems = check_model_folder("reward.judge.path", j.path, chat=True)
    problems += check_template(j.template, columns)
    try:
        build_parser(j.parse)
    except RewardError as exc:
        problems.append(str(exc))
    taken = {reward_name(s) for s in specs} | {cfg.reward.model.name}
    if j.name in taken:
        problems.append(
            f"reward.judge.name={j.name}: another reward has that name; give the judge another one"
        )
    return problems


def load_rewards(cfg: Config, specs: list[str]) -> tuple[list[RewardFn], list[str]]:
    """The reward functions ``specs`` (``reward.fn``) name, loaded, and the problems
    with them and with the reward model's settings (a function that fails to load
    is left out of the list)."""
    problems: list[str] = []
    reward_fns: list[RewardFn] = []
    if not specs and cfg.reward.model.path is None and cfg.reward.judge.path is None:
        problems.append(
            "reward.fn=[]: name at least one reward function (or a reward.model.path or "
            "reward.judge.path)"
        )
    if cfg.reward.model.path is not None:
        problems += check_reward_model(cfg.reward.model.path)
        if cfg.reward.model.name in {reward_name(s) for s in specs}:
            problems.append(
                f"reward.model.name={cfg.reward.model.name}: a reward function has that name; "
                "give the reward model another one"
            )
    problems += check_names(specs)
    for spec in specs:
        try:
            reward_fns.append(load_reward_fn(spec))
        except RewardError as exc:
            problems.append(f"reward.fn: {exc}")
    return reward_fns, problems


def build_plan(cfg: Config) -> RunPlan:
    """Resolve and check everything ``cfg`` implies; a ``ConfigError`` lists every
    problem found, so one run names them all."""
    problems = check_companions()
    device, found = check_device(cfg)
    problems += found
    try:
        check_model_path(cfg)
        problems += check_model_length(cfg)
        problems += check_megatron_model(cfg)
        problems += check_ulysses_model(cfg)
        if device is not None:
            problems += check_lora_adapter(cfg, device.kind)
    except ConfigError as exc:
        problems += exc.problems
    problems += check_teacher(cfg)
    specs = reward_specs(cfg.reward.fn)
    reward_fns, found = load_rewards(cfg, specs)
    problems += found
    rows: tuple[list[dict], list[dict], int] = ([], [], 0)
    try:
        rows = load_data(cfg)
    except DataError as exc:
        problems.append(str(exc))
    train_rows = rows[0]
    if len(reward_fns) == len(specs) and train_rows:
        columns = set(train_rows[0]) if isinstance(train_rows[0], dict) else set()
        for spec, fn in zip(specs, reward_fns):
            try:  # the calling style, and that the data has the columns it names
                call_plan(fn, columns, reward_name(spec))
            except RewardError as exc:
                problems.append(f"reward.fn={spec}: {exc}")
    problems += check_judge(cfg, specs, set(train_rows[0]) if train_rows else set())
    if cfg.agent.enabled:
        problems += check_agent(cfg)
    if problems:
        raise ConfigError(problems)
    assert device is not None
    plan = RunPlan(
        cfg,
        device,
        reward_fns,
        train_rows,
        rows[1],
        rows[2],
        algo_settings(cfg, merged_weights(specs, reward_fns, dict(cfg.reward.weights))),
    )
    plan.dropped_chars = check_builtin_charset(cfg, train_rows, rows[1])
    short_prompts = check_pd_prompts(cfg, train_rows)
    if short_prompts:
        log.warning(short_prompts)
    return plan
