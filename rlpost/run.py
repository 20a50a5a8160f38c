"""Build a run from a validated config: data, reward, Ray, workers; then train."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import yaml

from rlpost.config.compose import to_dict
from rlpost.config.groups import Config
from rlpost.config.schema import ConfigError
from rlpost.data.rows import DataError, load_rows, validate_row
from rlpost.loop.faults import StopOnSignal
from rlpost.loop.result import RunResult
from rlpost.rewards.loading import RewardError, load_reward_fn
from rlpost.rewards.scoring import RewardScorer, call_plan

log = logging.getLogger(__name__)


def make_run_dir(cfg: Config) -> Path:
    if cfg.trainer.run_dir:
        path = Path(cfg.trainer.run_dir)
    else:
        path = Path("outputs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.algo.name}"
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "config.yaml", "w") as f:
        yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
    return path.resolve()


def load_data(cfg: Config) -> tuple[list[dict], list[dict], int]:
    """Train rows, held-out rows and the number of malformed rows dropped."""
    if cfg.data.name != "files":
        from rlpost.data.tasks import build_task

        task = build_task(
            cfg.data.name,
            seed=cfg.trainer.seed,
            max_operand=cfg.data.max_operand,
            num_val=cfg.data.val_size,
        )
        rows = task.sft_rows() if cfg.algo.name == "sft" else task.train_rows()
        return rows, task.val_rows(), 0
    train: list[dict] = []
    val: list[dict] = []
    problems = []
    for key, paths, out in (
        ("train_files", cfg.data.train_files, train),
        ("val_files", cfg.data.val_files, val),
    ):
        for path in paths:
            try:
                out.extend(load_rows(path))
            except DataError as exc:
                problems.append(f"data.{key}: {exc}")
    if problems:
        raise DataError("\n  ".join(problems))
    if cfg.algo.name == "sft":
        train = [sft_row(r) for r in train]
        val = [sft_row(r) for r in val]
    bad = sum(validate_row(r) is not None for r in val)
    val = [r for r in val if validate_row(r) is None][: cfg.data.val_size]
    if not val:
        raise DataError(f"no valid held-out rows in {cfg.data.val_files}")
    if cfg.algo.name == "sft":
        missing = [i for i, r in enumerate(train) if "response" not in r and "messages" not in r]
        if missing:
            raise DataError(
                "algo=sft needs 'messages' (a chat with assistant turns) or 'prompt' and "
                f"'response' in every training row; rows {missing[:5]} have neither"
            )
    return train, val, bad


def sft_row(row: dict) -> dict:
    """A chat row (``messages``) also gets a ``prompt``: the conversation before its
    last assistant turn, which is what validation asks the model to continue."""
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or "prompt" in row:
        return row
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if not last:
        return row
    return {
        **row,
        "prompt": messages[:last],
        "answer": row.get("answer", messages[last]["content"]),
    }


def check_model_path(cfg: Config) -> None:
    """A local-looking model.path must hold an HF model; hub ids pass through."""
    path = cfg.model.path
    if not path:
        return
    p = Path(path).expanduser()
    if (path.startswith((".", "/", "~")) or p.exists()) and not (p / "config.json").exists():
        raise ConfigError([f"model.path={path!r}: no HF model (config.json) in that directory"])


def check_megatron_model(cfg: Config) -> list[str]:
    """``trainer=megatron``: the model is one the conversion knows and splits over
    trainer.megatron.tp and pp (read from its config.json, before any worker starts)."""
    if cfg.trainer.name != "megatron":
        return []
    from rlpost.trainers.megatron.config import MegatronParallel, check_divisible
    from rlpost.trainers.megatron.convert import shape_from_hf

    if cfg.model.path is None:
        from rlpost.models.tiny import build_config, build_tokenizer

        hf_config: Any = build_config(cfg.model.preset, build_tokenizer())
    else:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(cfg.model.path)
    mg = cfg.trainer.megatron
    try:
        split = MegatronParallel(
            tp=mg.tp, pp=mg.pp, vpp=mg.vpp, ep=mg.ep, sequence_parallel=mg.sequence_parallel
        )
        check_divisible(shape_from_hf(hf_config), split)
    except (NotImplementedError, ValueError) as exc:
        model = cfg.model.path or f"the built-in {cfg.model.preset!r} model"
        return [f"trainer.megatron.tp={mg.tp}, pp={mg.pp} with {model}: {exc}"]
    return []


def check_lora_adapter(cfg: Config) -> list[str]:
    """``rollout.lora_sync=adapter`` on a MoE model is refused on the CPU: vLLM's CPU
    build runs LoRA on MoE layers only through a Triton kernel it lacks (it fails at
    the first request); merged syncs work there."""
    if not (cfg.model.lora.rank and cfg.rollout.lora_sync == "adapter" and cfg.model.path):
        return []
    config_file = Path(cfg.model.path).expanduser() / "config.json"
    if cfg.rollout.name != "vllm" or not config_file.exists():
        return []
    from rlpost.device import resolve_device

    if resolve_device(cfg.trainer.device).kind != "cpu":
        return []
    config = json.loads(config_file.read_text())
    text = config.get("text_config") or config
    keys = ("num_experts", "num_local_experts", "n_routed_experts")
    if not any(text.get(k) for k in keys):
        return []
    return [
        f"rollout.lora_sync=adapter: model.path={cfg.model.path} is a mixture-of-experts model, "
        "and vLLM's CPU build serves LoRA adapters on those only through a Triton kernel it "
        "does not have; use rollout.lora_sync=merged"
    ]


def drop_long_prompts(rows: list[dict], tokenizer: Any, limit: int) -> tuple[list[dict], int]:
    """Rows whose templated prompt fits ``data.max_prompt_tokens``, and how many did not."""
    from rlpost.data.rows import validate_row
    from rlpost.data.samples import encode_prompt

    kept = [
        r for r in rows if validate_row(r) is not None or len(encode_prompt(tokenizer, r)) <= limit
    ]
    dropped = len(rows) - len(kept)
    if dropped:
        log.warning("dropped %d prompts longer than data.max_prompt_tokens=%d", dropped, limit)
    if not kept:
        raise DataError(f"every prompt is longer than data.max_prompt_tokens={limit}; raise it")
    return kept, dropped


def preflight(cfg: Config) -> tuple[Any, list[dict], list[dict], int]:
    """Every check of user input (model path, reward, data), reported together.

    Returns the reward function, train rows, held-out rows and the count of
    malformed rows dropped.
    """
    problems: list[str] = []
    reward_fn: Any = None
    rows: tuple[list[dict], list[dict], int] = ([], [], 0)
    try:
        check_model_path(cfg)
        problems.extend(check_megatron_model(cfg))
        problems.extend(check_lora_adapter(cfg))
    except ConfigError as exc:
        problems.extend(exc.problems)
    try:
        reward_fn = load_reward_fn(cfg.reward.fn)
    except RewardError as exc:
        problems.append(f"reward.fn: {exc}")
    try:
        rows = load_data(cfg)
    except DataError as exc:
        problems.append(str(exc))
    if reward_fn is not None and rows[0]:
        try:  # the calling style, and that the data has the columns it names
            call_plan(reward_fn, set(rows[0][0]) if isinstance(rows[0][0], dict) else set())
        except RewardError as exc:
            problems.append(f"reward.fn={cfg.reward.fn}: {exc}")
    if cfg.agent.enabled:
        problems.extend(check_agent(cfg))
    if problems:
        raise ConfigError(problems)
    return (reward_fn, *rows)


def check_agent(cfg: Config) -> list[str]:
    """``agent.tools`` / ``agent.env`` load, before any worker starts."""
    from rlpost.rollout.agent import EnvError, ToolError, get_parser
    from rlpost.rollout.agent.parsers import ParserError
    from rlpost.serving.agent_episodes import env_factory

    problems = []
    try:
        env_factory(cfg)
    except ToolError as exc:
        problems.append(f"agent.tools={list(cfg.agent.tools)}: {exc}")
    except EnvError as exc:
        problems.append(f"agent.env={cfg.agent.env}: {exc}")
    try:
        get_parser(cfg.agent.parser)
    except ParserError as exc:
        problems.append(f"agent.parser={cfg.agent.parser}: {exc}")
    return problems


def train(cfg: Config, stop: StopOnSignal | None = None) -> RunResult:
    """Run ``cfg`` to the end; returns the metric history and the final model's path.

    ``stop`` (the CLI's): SIGINT and SIGTERM stop the run at the next step
    boundary with a checkpoint, raising ``Interrupted`` after the cleanup.
    """
    # Everything that can fail on user input fails here, before Ray starts.
    reward_fn, train_rows, val_rows, bad_rows = preflight(cfg)

    import ray
    from transformers import AutoTokenizer

    from rlpost.device import resolve_device
    from rlpost.loop.controller import Controller, TrainerGroups, Workers
    from rlpost.loop.tracking import Tracker
    from rlpost.models.vl_inputs import ImageInputs, is_vision_language
    from rlpost.models.warmup import builtin_model, warmup_config
    from rlpost.serving.agent_episodes import AgentRollout
    from rlpost.serving.engine_settings import engine_config
    from rlpost.serving.rollout_group import RolloutGroup
    from rlpost.trainers.fsdp import FSDPEngineConfig, LoraSettings
    from rlpost.workers.placement import cpu_threads, start
    from rlpost.workers.trainer_worker import TrainerGroup

    device = resolve_device(cfg.trainer.device)
    run_dir = make_run_dir(cfg)

    # Joins RAY_ADDRESS's cluster (a Ray job) or starts a local Ray; reserves
    # one placement-group bundle per worker (trainer.placement).
    started_ray, placement = start(cfg, device.ray_resource)

    t = cfg.trainer

    rollout: Any = None

    lora = lora_settings(cfg)

    def make_trainer(
        model_path: str,
        lr: float,
        lr_warmup_steps: int,
        kind: str = "policy",
        trainable: bool = True,
        role: str = "policy",
        run_cfg: Config = cfg,
    ) -> TrainerGroup:
        """A trainer group of ``role`` as ``run_cfg`` says (the warm-up passes its own)."""
        rt, rm = run_cfg.trainer, run_cfg.model
        engine_cfg: Any
        if rt.name == "megatron":
            engine_cfg = megatron_engine_config(
                run_cfg, model_path, lr, lr_warmup_steps, trainable, packing=kind == "policy"
            )
        else:
            engine_cfg = FSDPEngineConfig(
                **engine_settings(run_cfg, model_path, lr, lr_warmup_steps, trainable),
                lora=lora_settings(run_cfg) if role == "policy" else LoraSettings(),
                gradient_checkpointing=rm.gradient_checkpointing,
                param_offload=rm.param_offload,
                optimizer_offload=rm.optimizer_offload,
                packing=rt.packing and kind == "policy",
                freeze_vision=rm.freeze_vision,
                mixed_precision=rt.mixed_precision,
            )
        # The warm-up's one rank takes the first of the policy's bundles.
        scheduling = placement.scheduling(role)[: rt.world_size]
        return TrainerGroup(
            engine_cfg, rt.world_size, rt.num_cpus_per_worker, engine_cfg.threads,
            device.ray_resource, kind, scheduling=scheduling,
        )  # fmt: skip

    def make_warmup_trainer(model_path: str, lr: float, lr_warmup_steps: int) -> TrainerGroup:
        return make_trainer(model_path, lr, lr_warmup_steps, run_cfg=warmup_config(cfg))

    workers: list[Any] = []
    tracker: Tracker | None = None
    scorer: RewardScorer | None = None
    try:
        if stop is not None:  # after Ray's start, which installs its own SIGTERM handler
            stop.install()
        placement.save(run_dir)
        model_path = cfg.model.path or builtin_model(cfg, make_warmup_trainer)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if cfg.data.name == "files":  # the built-in task's prompts are short by construction
            limit = cfg.data.max_prompt_tokens
            train_rows, too_long = drop_long_prompts(train_rows, tokenizer, limit)
            val_rows, too_long_val = drop_long_prompts(val_rows, tokenizer, limit)
            bad_rows += too_long + too_long_val

        def build_trainers() -> TrainerGroups:
            """Policy, reference and critic groups; first closes any from before (the
            controller rebuilds them all when a rank dies)."""
            for group in workers:
                group.close()
            workers.clear()
            policy = make_trainer(model_path, t.lr, t.lr_warmup_steps)
            workers.append(policy)
            reference = critic = None
            # Under LoRA the reference is the policy with its adapter disabled: no copy.
            if cfg.algo.needs_reference and not lora.enabled:
                reference = make_trainer(
                    model_path, t.lr, 0, kind="policy", trainable=False, role="reference"
                )
                workers.append(reference)
            if cfg.algo.needs_critic:
                critic = make_trainer(
                    model_path, t.critic_lr, t.lr_warmup_steps, kind="critic", role="critic"
                )
                workers.append(critic)
            return policy, reference, critic

        policy, reference, critic = build_trainers()
        r = cfg.rollout
        rollout = RolloutGroup(
            engine_config(cfg, model_path, device.kind),
            replicas=r.replicas,
            num_cpus=r.num_cpus,
            threads=cpu_threads(cfg, device.kind, "rollout"),
            device_opts=device.ray_resource,
            engine=r.name,
            scheduling=placement.scheduling("rollout"),
        )
        tracker = Tracker(run_dir, list(t.logger), t.total_steps, to_dict(cfg))
        rw = cfg.reward
        scorer = RewardScorer(
            reward_fn, dict(rw.weights) or None, spec=rw.fn, num_workers=rw.num_workers,
            timeout_s=rw.timeout_s, max_error_frac=rw.max_error_frac,
        )  # fmt: skip
        controller = Controller(
            cfg, run_dir, Workers(policy, rollout, reference, critic), tokenizer,
            train_rows, val_rows, scorer, tracker, bad_rows, rebuild_trainers=build_trainers,
            stop_requested=stop.requested if stop is not None else None,
            agent=AgentRollout(cfg, rollout, tokenizer) if cfg.agent.enabled else None,
            image_inputs=ImageInputs(model_path) if is_vision_language(model_path) else None,
        )  # fmt: skip
        if stop is not None:
            stop.armed = True  # from here a signal waits for the end of the step
        result = controller.run()
        tracker.plot()
        return result
    finally:
        if scorer is not None:
            scorer.close()
        if tracker is not None:
            tracker.close()
        for group in workers:
            group.close()
        if rollout is not None:
            rollout.close()
        placement.remove()
        if started_ray:
            ray.shutdown()
        if stop is not None:
            stop.restore()


def lora_settings(cfg: Config) -> Any:
    """``model.lora`` as the FSDP2 engine takes it."""
    from rlpost.trainers.fsdp import LoraSettings

    lora = cfg.model.lora
    modules = lora.target_modules
    return LoraSettings(
        rank=lora.rank,
        alpha=lora.alpha,
        dropout=lora.dropout,
        target_modules=modules if isinstance(modules, str) else tuple(modules),
    )


def engine_settings(
    cfg: Config, model_path: str, lr: float, lr_warmup_steps: int, trainable: bool
) -> dict[str, Any]:
    """The fields every training engine's config shares (``rlpost.trainers.engine_config``)."""
    from rlpost.device import resolve_device
    from rlpost.workers.placement import cpu_threads

    t = cfg.trainer
    device = resolve_device(t.device)
    return dict(
        model_path=model_path,
        dtype=cfg.model.dtype,
        lr=lr,
        weight_decay=t.weight_decay,
        betas=(t.betas[0], t.betas[1]),
        max_grad_norm=t.max_grad_norm,
        micro_batch_size=t.micro_batch_size,
        seed=t.seed,
        device=device.kind,
        backend=device.backend,
        threads=cpu_threads(cfg, device.kind),
        lr_warmup_steps=lr_warmup_steps,
        trainable=trainable,
        micro_batch_tokens=t.micro_batch_tokens,
    )


def megatron_engine_config(
    cfg: Config,
    model_path: str,
    lr: float,
    lr_warmup_steps: int,
    trainable: bool,
    packing: bool = True,
) -> Any:
    """The Megatron engines' settings for ``trainer=megatron`` (policy, reference and
    critic; the critic runs padded, ``packing=False``)."""
    from rlpost.trainers.megatron.config import MegatronEngineConfig, MegatronParallel

    mg = cfg.trainer.megatron
    return MegatronEngineConfig(
        **engine_settings(cfg, model_path, lr, lr_warmup_steps, trainable),
        packing=cfg.trainer.packing and packing,
        parallel=MegatronParallel(
            tp=mg.tp,
            pp=mg.pp,
            vpp=mg.vpp,
            cp=mg.cp,
            ep=mg.ep,
            sequence_parallel=mg.sequence_parallel,
            distributed_optimizer=mg.distributed_optimizer,
            recompute=mg.recompute,
        ),
    )
