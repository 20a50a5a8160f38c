"""Start what a plan asks for -- Ray, the placement group, the trainer groups,
the rollout replicas, the reward workers, the tracker -- and close it all
again, in one place."""

from __future__ import annotations

import importlib
import logging
import threading
from typing import TYPE_CHECKING

from rlpost.loop.controller import Controller
from rlpost.loop.faults import StopOnSignal
from rlpost.loop.roles import TrainerGroups, Workers
from rlpost.loop.tracking import Tracker
from rlpost.plan.engines import rollout_engine_config
from rlpost.plan.plan import RunPlan
from rlpost.rewards.scoring import Scorer
from rlpost.workers.trainer_worker import TrainerGroup

if TYPE_CHECKING:
    from rlpost.rewards.judge import JudgeReward
    from rlpost.serving.agent_episodes import AgentRollout
    from rlpost.serving.rollout_group import RolloutGroup
    from rlpost.trainers.fsdp import FSDPEngineConfig
    from rlpost.trainers.megatron.config import MegatronEngineConfig
    from rlpost.workers.reward_model_worker import RewardModelGroup

log = logging.getLogger(__name__)

# What the driver imports right after Ray has started: the tokenizer's modules, and
# the built-in model's builder when the run has no model.path. ~2.5 s on two cores,
# made while Ray's start waits for the processes it spawns.
AFTER_RAY = ("transformers", "transformers.models.auto.tokenization_auto")
AFTER_RAY_BUILTIN = ("rlpost.models.tiny",)


def import_in_background(modules: tuple[str, ...]) -> threading.Thread:
    """Import ``modules`` on a daemon thread; ``join()`` it before using them.

    Python's per-module import locks alone would not make a concurrent import
    safe: transformers puts a lazy module into ``sys.modules`` partway through its
    own import, which another thread's ``from transformers import X`` takes as
    finished. A failure is left to be raised again, in context, by the import
    that needs the module."""

    def run() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # raised again where the module is used
                return

    thread = threading.Thread(target=run, name="rlpost-import", daemon=True)
    thread.start()
    return thread


class Launch:
    """``with Launch(plan, stop) as launch: launch.controller().run()``.

    Entering joins ``RAY_ADDRESS``'s cluster (a Ray job) or starts a local Ray,
    and reserves one placement-group bundle per worker (``trainer.placement``);
    leaving closes every worker and Ray. ``stop`` (the CLI's): SIGINT and SIGTERM
    stop the run at the next step boundary with a checkpoint.
    """

    def __init__(self, plan: RunPlan, stop: StopOnSignal | None = None):
        self.plan, self.cfg, self.stop = plan, plan.cfg, stop
        self.trainers: list[TrainerGroup] = []
        self.rollout: RolloutGroup | None = None
        self.tracker: Tracker | None = None
        self.agent: AgentRollout | None = None
        self.scorer: Scorer | None = None
        self.reward_model: RewardModelGroup | None = None  # reward.model's worker
        self.judge: RolloutGroup | None = None  # reward.judge's rollout group
        self.started_ray = False
        self.imports: threading.Thread | None = None  # AFTER_RAY's, joined by controller()
        # __enter__ sets self.run_dir and self.placement (the run's placement groups).

    def __enter__(self) -> Launch:
        from rlpost.workers.placement import set_wait_policy, start

        set_wait_policy(self.cfg, self.plan.device.kind)
        self.run_dir = self.plan.make_run_dir()
        builtin = AFTER_RAY_BUILTIN if self.cfg.model.path is None else ()
        self.imports = import_in_background(AFTER_RAY + builtin)
        self.started_ray, self.placement = start(self.cfg, self.plan.device.ray_resource)
        try:
            if self.stop is not None:  # after Ray's start, which installs its own SIGTERM handler
                self.stop.install()
            self.placement.save(self.run_dir)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.agent is not None:
            self.agent.close()
        if self.scorer is not None:
            self.scorer.close()
        if self.reward_model is not None:
            self.reward_model.close()
        if self.judge is not None:
            self.judge.close()
        if self.tracker is not None:
            self.tracker.close()
        for group in self.trainers:
            group.close()
        if self.rollout is not None:
            self.rollout.close()
        self.placement.remove()
        if self.started_ray:
            from rlpost.workers.placement import disconnect

            disconnect()
        if self.stop is not None:
            self.stop.restore()

    # -- workers -------------------------------------------------------------------
    def trainer_group(
        self,
        role: str,
        engine_cfg: FSDPEngineConfig | MegatronEngineConfig,
        world_size: int,
        kind: str | None = None,
    ) -> TrainerGroup:
        """``kind``: the engine (``rlpost.trainers.registry``; default: the role's own)."""
        t = self.cfg.trainer
        scheduling = self.placement.scheduling(role)[:world_size]
        kind = kind or ("critic" if role == "critic" else "policy")
        return TrainerGroup(
            engine_cfg, world_size, t.num_cpus_per_worker, engine_cfg.threads,
            self.plan.device.ray_resource, kind, scheduling=scheduling,
        )  # fmt: skip

    def warmup_trainer(self, model_path: str, lr: float, lr_warmup_steps: int) -> TrainerGroup:
        """The built-in model's warm-up: one rank with the warm-up's own recipe, on the
        first of the policy's bundles."""
        from rlpost.models.warmup import warmup_config
        from rlpost.plan.engines import trainer_engine_config

        wcfg = warmup_config(self.cfg)
        engine_cfg = trainer_engine_config(
            wcfg, "policy", model_path, self.plan.device, lr, lr_warmup_steps
        )
        return self.trainer_group("policy", engine_cfg, wcfg.trainer.world_size)

    def build_trainers(self, model_path: str) -> TrainerGroups:
        """Policy, reference, critic and teacher groups (those the plan's roles name);
        first closes any from before (the controller rebuilds them all when a rank
        dies)."""
        for group in self.trainers:
            group.close()
        self.trainers.clear()
        groups: dict[str, TrainerGroup] = {}
        for role in self.plan.roles:
            engine_cfg = self.plan.trainer_engine(role, model_path)
            groups[role] = self.trainer_group(
                role, engine_cfg, self.cfg.trainer.world_size, self.plan.engine_kind(role)
            )
            self.trainers.append(groups[role])
        return (
            groups["policy"], groups.get("reference"), groups.get("critic"), groups.get("teacher")
        )  # fmt: skip

    def reward_members(self) -> list[tuple[str, Scorer]]:
        """``reward.model``'s worker and ``reward.judge``'s engine, each started on its
        own bundle, as named members of the reward set (none without their paths)."""
        members: list[tuple[str, Scorer]] = []
        rm, device = self.cfg.reward.model, self.plan.device
        if rm.path is not None:
            from rlpost.rewards.reward_model import ModelReward
            from rlpost.workers.reward_model_worker import RewardModelGroup

            threads = max(1, int(rm.num_cpus)) if device.kind == "cpu" else 1
            where = self.placement.scheduling("reward_model")[0]
            self.reward_model = RewardModelGroup(rm, threads, device.ray_resource, where)
            score = self.reward_model.score
            members.append((rm.name, ModelReward(rm.name, score, self.cfg.reward.max_error_frac)))
        if self.cfg.reward.judge.path is not None:
            members.append((self.cfg.reward.judge.name, self.judge_reward()))
        return members

    def judge_reward(self) -> JudgeReward:
        """``reward.judge``: its own rollout group (the run's engine, without PD or
        LoRA) and the reward that asks it for verdicts."""
        import dataclasses

        from transformers import AutoTokenizer, BatchEncoding

        from rlpost.rewards.judge import JudgeReward, build_parser
        from rlpost.rollout.base import GenerationRequest, SamplingConfig
        from rlpost.serving.rollout_group import RolloutGroup

        cfg, j, device = self.cfg, self.cfg.reward.judge, self.plan.device
        r, path = cfg.rollout, str(j.path)
        limit = j.max_model_len or r.max_model_len
        own = dataclasses.replace(
            cfg,
            rollout=dataclasses.replace(
                r, pd=dataclasses.replace(r.pd, enabled=False), max_model_len=limit
            ),
            model=dataclasses.replace(cfg.model, lora=dataclasses.replace(cfg.model.lora, rank=0)),
        )
        self.judge = RolloutGroup(
            rollout_engine_config(own, path, device.kind), replicas=1, num_cpus=j.num_cpus,
            threads=max(1, int(j.num_cpus)) if device.kind == "cpu" else 1,
            device_opts=device.ray_resource, engine=r.name,
            scheduling=self.placement.scheduling("judge"),
        )  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(path)
        sampling = SamplingConfig(n=1, temperature=j.temperature, max_tokens=j.max_tokens)
        judge = self.judge

        def encode(text: str) -> list[int]:
            chat = [{"role": "user", "content": text}]
            out = tokenizer.apply_chat_template(
                chat, add_generation_prompt=True, tokenize=True, return_dict=True
            )
            assert isinstance(out, BatchEncoding)  # return_dict=True: the ids and the mask
            return list(out["input_ids"])

        def generate(prompts: list[list[int]]) -> list[str]:
            fits = [i for i, ids in enumerate(prompts) if len(ids) + j.max_tokens <= limit]
            if len(fits) < len(prompts):
                log.warning(
                    "reward.judge: %d of %d prompts are longer than reward.judge.max_model_len "
                    "(%d) less max_tokens; they count as unparsable verdicts",
                    len(prompts) - len(fits), len(prompts), limit,
                )  # fmt: skip
            results = judge.generate([GenerationRequest(prompts[i], sampling) for i in fits])
            verdicts = [""] * len(prompts)
            for i, result in zip(fits, results):
                verdicts[i] = result.completions[0].text
            return verdicts

        max_error_frac = cfg.reward.max_error_frac
        return JudgeReward(
            j.name, j.template, build_parser(j.parse), encode, generate, max_error_frac
        )

    def controller(self) -> Controller:
        """The model (the built-in one warmed up on first use), its tokenizer, every
        worker group and the controller that drives them."""
        if self.imports is not None:
            self.imports.join()
        from transformers import AutoTokenizer

        from rlpost.models.vl_inputs import ImageInputs, is_vision_language
        from rlpost.models.warmup import builtin_model
        from rlpost.serving.agent_episodes import AgentRollout
        from rlpost.serving.rollout_group import RolloutGroup
        from rlpost.workers.placement import cpu_threads

        cfg, plan = self.cfg, self.plan
        model_path = cfg.model.path or builtin_model(cfg, self.warmup_trainer)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        plan.fit_prompts(tokenizer)
        r = cfg.rollout
        # The replicas start their engines while the trainer groups start theirs.
        self.rollout = RolloutGroup(
            plan.rollout_engine(model_path),
            replicas=r.replicas,
            num_cpus=r.num_cpus,
            threads=cpu_threads(cfg, plan.device.kind, "rollout"),
            device_opts=plan.device.ray_resource,
            engine=r.name,
            scheduling=self.placement.scheduling("rollout"),
            wait=False,
        )
        policy, reference, critic, teacher = self.build_trainers(model_path)
        self.rollout.wait_ready()
        t = cfg.trainer
        from rlpost.config.compose import to_dict

        self.tracker = Tracker(self.run_dir, list(t.logger), t.total_steps, to_dict(cfg))
        self.scorer = plan.scorer(self.reward_members())
        agent = None
        if cfg.agent.enabled:  # a training row opens the episode its tool check renders
            example = plan.train_rows[0] if plan.train_rows else None
            agent = self.agent = AgentRollout(cfg, self.rollout, tokenizer, example)
        return Controller(
            plan, self.run_dir, Workers(policy, self.rollout, reference, critic, teacher), tokenizer,
            self.scorer, self.tracker, rebuild_trainers=lambda: self.build_trainers(model_path),
            stop_requested=self.stop.requested if self.stop is not None else None,
            agent=agent,
            image_inputs=ImageInputs(model_path) if is_vision_language(model_path) else None,
        )  # fmt: skip
