"""The config checks that involve more than one key: combinations that cannot
work, named with the keys to change. ``rlpost.config.from_dict`` runs them after
each group's schema has been validated."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlpost.config.distill_checks import distill_checks
from rlpost.config.groups import PREFERENCE_PRESETS
from rlpost.config.ignored_checks import ignored_key_checks
from rlpost.config.preference_checks import preference_checks

if TYPE_CHECKING:
    from rlpost.config.groups import Config


def cross_checks(cfg: Config) -> list[str]:
    """Problems that involve more than one key (each group's own fields are checked
    by the schema); every problem is reported, not only the first."""
    checks = (
        algo_checks, rollout_checks, data_checks, agent_checks, trainer_checks, async_checks,
        eval_checks, preference_checks, distill_checks, ignored_key_checks,
    )  # fmt: skip
    return [problem for check in checks for problem in check(cfg)]


def algo_checks(cfg: Config) -> list[str]:
    """The algorithm's registries, and what its settings need of the others."""
    from rlpost.algos import ADVANTAGE_ESTIMATORS, OFF_POLICY, POLICY_LOSSES

    problems = []
    a = cfg.algo
    if a.advantage.estimator not in ADVANTAGE_ESTIMATORS:
        problems.append(
            f"algo.advantage.estimator={a.advantage.estimator!r}: expected one of "
            f"{', '.join(sorted(ADVANTAGE_ESTIMATORS))}"
        )
    if a.policy_loss.name not in POLICY_LOSSES:
        problems.append(
            f"algo.policy_loss.name={a.policy_loss.name!r}: expected one of "
            f"{', '.join(sorted(POLICY_LOSSES))}"
        )
    if a.off_policy.name not in OFF_POLICY:  # the group's own rules are OffPolicyConfig's
        problems.append(
            f"algo.off_policy.name={a.off_policy.name!r}: expected one of "
            f"{', '.join(sorted(OFF_POLICY))}"
        )
    # DAPO's overlong limit is a sample's budget: a whole episode's in agent mode.
    limit = "agent.max_response_tokens" if cfg.agent.enabled else "rollout.max_tokens"
    budget = cfg.agent.max_response_tokens if cfg.agent.enabled else cfg.rollout.max_tokens
    if a.overlong.enabled and a.overlong.buffer > budget:
        problems.append(f"algo.overlong.buffer={a.overlong.buffer}: must be <= {limit}={budget}")
    return problems


def rollout_checks(cfg: Config) -> list[str]:
    """The rollout engine's settings against each other and the prompt budget."""
    problems = []
    if cfg.rollout.lora_sync == "adapter" and cfg.rollout.name != "vllm":
        problems.append(
            f"rollout.lora_sync=adapter: rollout.name={cfg.rollout.name} serves no LoRA adapters; "
            "use rollout.lora_sync=merged"
        )
    if cfg.rollout.lora_sync == "adapter" and not cfg.model.lora.rank:
        problems.append(
            "rollout.lora_sync=adapter: model.lora.rank=0 trains the full model, so there is "
            "no adapter to send; set model.lora.rank (e.g. model.lora.rank=8) or drop "
            "rollout.lora_sync=adapter"
        )
    if cfg.rollout.weight_sync in ("collective", "ipc"):
        if cfg.rollout.name != "vllm":
            problems.append(
                f"rollout.weight_sync={cfg.rollout.weight_sync}: rollout.name={cfg.rollout.name} "
                "loads weights only through the object store; use "
                "rollout.weight_sync=object_store (or auto)"
            )
    if cfg.rollout.weight_sync == "ipc":
        # The replica maps memory of trainer rank 0's process: it must share its node
        # (and, on a GPU, its device), and one replica reads each bucket.
        if cfg.rollout.replicas != 1 or cfg.rollout.pd.enabled:
            what = (
                "rollout.pd.enabled=true"
                if cfg.rollout.pd.enabled
                else (f"rollout.replicas={cfg.rollout.replicas}")
            )
            problems.append(
                f"rollout.weight_sync=ipc hands weights to one colocated replica, not with "
                f"{what}: use rollout.weight_sync=collective"
            )
        if cfg.trainer.placement != "colocated":
            problems.append(
                f"rollout.weight_sync=ipc: trainer.placement={cfg.trainer.placement} may put the "
                "replica on another node than trainer rank 0, whose memory it maps; use "
                "trainer.placement=colocated or rollout.weight_sync=collective"
            )
    if cfg.rollout.sleep == "on":
        if cfg.trainer.device == "cpu" or cfg.rollout.name != "vllm":
            problems.append(
                f"rollout.sleep=on: needs vLLM on an accelerator (trainer.device="
                f"{cfg.trainer.device}, rollout.name={cfg.rollout.name}): vLLM's CPU build has "
                "no sleep mode; use rollout.sleep=auto or off"
            )
        if cfg.trainer.async_mode != "sync":
            problems.append(
                f"rollout.sleep=on: trainer.async_mode={cfg.trainer.async_mode} generates while "
                "it trains, so the replicas cannot sleep during the update; use "
                "trainer.async_mode=sync or rollout.sleep=off"
            )
    pd = cfg.rollout.pd
    if pd.enabled:
        total = pd.prefill_replicas + pd.decode_replicas
        if cfg.rollout.replicas not in (1, total):
            problems.append(
                f"rollout.replicas={cfg.rollout.replicas}: with rollout.pd.enabled=true the "
                f"replicas are rollout.pd.prefill_replicas + rollout.pd.decode_replicas = {total}; "
                "leave rollout.replicas unset or set it to that sum"
            )
        if cfg.rollout.name == "hf":
            problems.append(
                "rollout.pd.enabled=true: rollout.name=hf has no KV transfer; use vllm or sglang"
            )
    if cfg.rollout.min_tokens > cfg.rollout.max_tokens:
        problems.append(
            f"rollout.min_tokens={cfg.rollout.min_tokens}: must be <= rollout.max_tokens={cfg.rollout.max_tokens}"
        )
    if cfg.rollout.max_tokens + cfg.data.max_prompt_tokens > cfg.rollout.max_model_len:
        problems.append(
            f"rollout.max_model_len={cfg.rollout.max_model_len}: must be >= data.max_prompt_tokens"
            f" + rollout.max_tokens = {cfg.data.max_prompt_tokens + cfg.rollout.max_tokens}; "
            "raise it within the model's positions (max_position_embeddings; the built-in "
            "models have 256), or lower data.max_prompt_tokens or rollout.max_tokens"
        )
    return problems


def data_checks(cfg: Config) -> list[str]:
    """The data source against the files and the task it names."""
    problems = []
    if cfg.data.name != "files":
        for key in ("train_files", "val_files"):
            if getattr(cfg.data, key):
                problems.append(
                    f"data.{key}={getattr(cfg.data, key)}: data.name={cfg.data.name} is the "
                    f"built-in task and would ignore these files; add data=files to train on them"
                )
    if cfg.data.name != "files":
        shaped = {
            "prompt_key": cfg.data.prompt_key != "prompt",
            "answer_key": cfg.data.answer_key != "answer",
            "prompt_template": cfg.data.prompt_template is not None,
            "system_prompt": cfg.data.system_prompt is not None,
        }
        for key in (k for k, given in shaped.items() if given):
            problems.append(
                f"data.{key}: shapes the rows of data files; data.name={cfg.data.name} builds "
                "its own prompts (add data=files, or leave the key out)"
            )
    if cfg.data.name == "files" and not cfg.data.train_files:
        problems.append("data.train_files: required when data.name=files")
    if cfg.data.name == "files" and not cfg.data.val_files:
        problems.append("data.val_files: required when data.name=files")
    if cfg.data.name == "calc" and not cfg.agent.enabled and cfg.algo.name != "sft":
        problems.append(
            "data.name=calc: the calc task is solved by calling the multiply tool; "
            "use agent=calculator (or set agent.tools=[multiply])"
        )
    if cfg.data.name == "shapes" and cfg.model.path is None and cfg.model.preset != "tiny_vl":
        problems.append(
            f"data.name=shapes: its prompts hold images; model.preset={cfg.model.preset} is a "
            "text model: use model=tiny_vl (data=shapes selects it) or a vision-language "
            "model.path"
        )
    return problems


def agent_checks(cfg: Config) -> list[str]:
    """Agent mode: tools or an environment, and an RL preset."""
    problems = []
    if cfg.agent.program is not None and cfg.agent.env is not None:
        problems.append(
            f"agent.program and agent.env are both set: the program {cfg.agent.program} runs the "
            "episodes itself and no environment answers it; drop one of them"
        )
    if cfg.agent.env is not None and cfg.agent.tools:
        problems.append(
            "agent.env and agent.tools are both set: an environment answers the model itself; "
            "drop agent.tools, or drop agent.env to use the tools"
        )
    turn, budget = cfg.agent.max_turn_tokens, cfg.agent.max_response_tokens
    if turn is not None and turn > budget:
        problems.append(
            f"agent.max_turn_tokens={turn}: a turn cannot be longer than its episode's "
            f"agent.max_response_tokens={budget}; lower it, or leave it unset (null) for "
            "whatever the episode's budget leaves"
        )
    lat = cfg.agent.tool_latency_s
    if lat and (len(lat) != 2 or not 0 <= lat[0] <= lat[1]):
        problems.append(
            f"agent.tool_latency_s={lat}: expected [lo, hi] seconds with 0 <= lo <= hi "
            "(e.g. [0,2]), or [] for none"
        )
    elif lat and cfg.agent.env is not None:
        problems.append(
            "agent.tool_latency_s delays the calls of agent.tools; an agent.env answers "
            "itself: drop agent.tool_latency_s or put the delay in the environment"
        )
    if cfg.agent.enabled and cfg.algo.name == "sft":
        problems.append(
            "agent.tools / agent.env: algo=sft trains on fixed chats (data rows with "
            "'messages'); use an RL preset (e.g. algo=grpo) for agent episodes"
        )
    return problems


def trainer_checks(cfg: Config) -> list[str]:
    """The trainer's precision, offload, layout and batch split."""
    problems = []
    if cfg.trainer.mixed_precision == "bf16" and cfg.model.dtype != "float32":
        problems.append(
            f"trainer.mixed_precision=bf16 with model.dtype={cfg.model.dtype}: mixed precision "
            "keeps float32 master weights; set model.dtype=float32 (or mixed_precision=none "
            f"to train in {cfg.model.dtype} throughout)"
        )
    if cfg.model.optimizer_offload and not cfg.model.param_offload:
        problems.append(
            "model.optimizer_offload=true: FSDP2 offloads optimizer state together with the "
            "parameters; set model.param_offload=true as well"
        )
    if cfg.trainer.name == "megatron":
        problems.extend(megatron_checks(cfg))
    problems.extend(ulysses_checks(cfg))
    if cfg.trainer.prefix_sharing == "on" and cfg.trainer.name != "fsdp":
        problems.append(
            f"trainer.prefix_sharing=on with trainer={cfg.trainer.name}: prefix sharing is the "
            "fsdp trainer's; set trainer.prefix_sharing=off (auto runs unshared there)"
        )
    if cfg.trainer.compile and cfg.trainer.name != "fsdp":
        problems.append(
            f"trainer.compile=true with trainer={cfg.trainer.name}: compiling the decoder "
            "layers and log-prob kernels is the fsdp trainer's; set trainer.compile=false"
        )
    if cfg.trainer.prefix_sharing == "on" and cfg.trainer.ulysses > 1:
        problems.append(
            f"trainer.prefix_sharing=on with trainer.ulysses={cfg.trainer.ulysses}: a "
            "sequence-parallel rank holds a slice of each sample, not whole prefixes; set "
            "trainer.prefix_sharing=off or auto"
        )
    if len(cfg.trainer.betas) != 2:
        problems.append(f"trainer.betas={cfg.trainer.betas}: expected two numbers")
    samples = cfg.data.prompts_per_step * cfg.rollout.n
    offline = cfg.algo.name == "sft" or cfg.algo.name in PREFERENCE_PRESETS
    if not offline and samples % (cfg.trainer.world_size * cfg.algo.mini_batches):
        problems.append(
            f"data.prompts_per_step x rollout.n = {samples} must divide by "
            f"trainer.world_size x algo.mini_batches = {cfg.trainer.world_size * cfg.algo.mini_batches}"
        )
    return problems


def ulysses_checks(cfg: Config) -> list[str]:
    """``trainer.ulysses``: the FSDP2 trainer, ranks that divide into groups, and not
    a reward model (the model itself is checked against its config.json by
    ``rlpost.plan.checks.check_ulysses_model``)."""
    t, n = cfg.trainer, cfg.trainer.ulysses
    if n == 1:
        return []
    problems = []
    if t.name != "fsdp":
        problems.append(
            f"trainer.ulysses={n} with trainer={t.name}: Ulysses is the fsdp trainer's; "
            "megatron splits sequences with trainer.megatron.cp"
        )
    if t.world_size % n:
        problems.append(
            f"trainer.ulysses={n}: must divide trainer.world_size={t.world_size} "
            f"(e.g. trainer.world_size={n})"
        )
    if cfg.algo.name == "rm":
        problems.append(
            f"trainer.ulysses={n} with algo=rm: the reward model's engine has no "
            "sequence-parallel forward; set trainer.ulysses=1"
        )
    return problems


def async_checks(cfg: Config) -> list[str]:
    """``async.*``: what fully asynchronous training needs of the rollout."""
    a, r = cfg.async_, cfg.rollout
    problems = []
    touched = a != type(a)()
    if touched and cfg.trainer.async_mode != "fully_async":
        problems.append(
            f"async.* is set but trainer.async_mode={cfg.trainer.async_mode}: the async group "
            "configures trainer.async_mode=fully_async; set that, or drop the async.* keys"
        )
    if cfg.trainer.async_mode != "fully_async" or not a.partial_rollout:
        return problems
    if r.name != "vllm":
        problems.append(
            f"async.partial_rollout=true needs rollout.name=vllm (rollout.name={r.name} cannot "
            "interrupt a request and continue it); set async.partial_rollout=false"
        )
    if r.pd.enabled:
        problems.append(
            "async.partial_rollout=true with rollout.pd.enabled=true: a request's prefill and "
            "decode halves must see the same weights; set async.partial_rollout=false"
        )
    return problems


def eval_checks(cfg: Config) -> list[str]:
    """``eval.k`` against ``eval.n``: pass@k and maj@k draw k of a prompt's n samples."""
    e = cfg.eval
    bad = [k for k in e.k if not 1 <= k <= e.n]
    if not bad:
        return []
    fix = f"drop {bad}"
    if max(bad) > e.n:
        fix += f" or raise eval.n to {max(bad)}"
    return [
        f"eval.k={e.k}: each k must be between 1 and eval.n={e.n} (pass@k and maj@k draw k "
        f"of a prompt's n samples); {fix}"
    ]


def megatron_checks(cfg: Config) -> list[str]:
    """Layouts and settings ``trainer=megatron`` cannot run (the model's own shape is
    checked against tp and pp once its config is read, see ``rlpost.plan.checks``)."""
    t, mg = cfg.trainer, cfg.trainer.megatron
    problems = []
    model_parallel = mg.tp * mg.pp * mg.cp
    if t.world_size % model_parallel:
        problems.append(
            f"trainer.world_size={t.world_size}: must divide by trainer.megatron.tp x pp x cp "
            f"= {mg.tp} x {mg.pp} x {mg.cp} = {model_parallel} (the rest is data parallelism)"
        )
    if mg.dp and t.world_size != model_parallel * mg.dp:
        problems.append(
            f"trainer.megatron.dp={mg.dp}: trainer.world_size={t.world_size} must equal "
            f"tp x pp x cp x dp = {model_parallel * mg.dp}; leave trainer.world_size unset "
            "to follow the layout"
        )
    if mg.vpp > 1 and mg.pp == 1:
        problems.append(
            f"trainer.megatron.vpp={mg.vpp}: virtual stages need trainer.megatron.pp > 1"
        )
    if mg.ep > 1 and t.world_size % (mg.tp * mg.pp * mg.ep):
        problems.append(
            f"trainer.world_size={t.world_size}: must divide by trainer.megatron.tp x pp x ep "
            f"= {mg.tp * mg.pp * mg.ep} (expert-parallel ranks are data-parallel ranks)"
        )
    if mg.ep > 1 and cfg.model.path is None:
        problems.append(
            f"trainer.megatron.ep={mg.ep}: expert parallelism needs an MoE model; the built-in "
            "model (model.path=null) is dense"
        )
    if mg.vpp > 1 and t.packing:
        problems.append(
            f"trainer.megatron.vpp={mg.vpp} with trainer.packing=true: interleaved stages send "
            "one shape for every micro-batch, packed rows have many (set one of them off)"
        )
    if mg.sequence_parallel and mg.tp == 1:
        problems.append("trainer.megatron.sequence_parallel=true: needs trainer.megatron.tp > 1")
    if cfg.model.lora.rank > 0:
        problems.append(
            f"model.lora.rank={cfg.model.lora.rank}: trainer=megatron has no LoRA yet; "
            "use trainer=fsdp for LoRA"
        )
    if cfg.model.dtype != "float32" or t.mixed_precision != "none":
        problems.append(
            f"model.dtype={cfg.model.dtype}, trainer.mixed_precision={t.mixed_precision}: "
            "trainer=megatron trains in float32 for now (model.dtype=float32, mixed_precision=none)"
        )
    for key in ("gradient_checkpointing", "param_offload", "optimizer_offload"):
        if getattr(cfg.model, key):
            problems.append(
                f"model.{key}=true: an FSDP2 setting; with trainer=megatron use "
                "trainer.megatron.recompute / distributed_optimizer"
            )
    return problems
