"""The run config's schema: one frozen dataclass per Hydra group, validated by
``rlpost.config.schema``; ``Config`` holds them all. The task side (data,
reward, eval) is in ``rlpost.config.task_groups``, the algorithm group's parts
in ``rlpost.algos`` (the configs its functions take) and
``rlpost.config.algo_groups`` (the rest)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlpost.algos.config import AdvantageConfig, DistillConfig, OffPolicyConfig, PolicyLossConfig
from rlpost.config.algo_groups import (
    DPOSchema,
    DynamicSamplingSchema,
    KLSchema,
    OverlongSchema,
    RMSchema,
)
from rlpost.config.schema import spec
from rlpost.config.task_groups import DataConfig, EvalConfig, RewardConfig, TeacherConfig
from rlpost.trainers.lora_settings import LoraSettings
from rlpost.trainers.megatron.config import MegatronParallel

GROUPS = ("algo", "model", "rollout", "trainer", "data", "reward", "agent")


ALGO_PRESETS = (
    "grpo",
    "dapo",
    "ppo",
    "gspo",
    "gdpo",
    "rloo",
    "reinforce_pp",
    "dr_grpo",
    "cispo",
    "sapo",
    "sft",
    "dpo",
    "rm",
    "opd",
)
# Offline presets that train on preference pairs (rlpost.loop.preference).
PREFERENCE_PRESETS = ("dpo", "rm")


@dataclass(frozen=True)
class AlgoConfig:
    name: str = spec(help="preset label", choices=ALGO_PRESETS)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    kl: KLSchema = field(default_factory=KLSchema)
    entropy_coef: float = spec(0.0, help="entropy bonus coefficient (entropy is always reported)")
    dynamic_sampling: DynamicSamplingSchema = field(default_factory=DynamicSamplingSchema)
    overlong: OverlongSchema = field(default_factory=OverlongSchema)
    filter_truncated: bool = spec(False, help="DAPO: no loss on completions cut at max_tokens")
    value_clip: float = spec(0.5, gt=0, help="PPO critic: clip of the value update")
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    epochs: int = spec(1, ge=1, help="passes over each step's batch")
    mini_batches: int = spec(1, ge=1, help="optimizer steps per pass over the batch")
    dpo: DPOSchema = field(default_factory=DPOSchema)
    rm: RMSchema = field(default_factory=RMSchema)
    opd: DistillConfig = field(default_factory=DistillConfig)

    @property
    def needs_teacher(self) -> bool:
        return self.name == "opd"

    @property
    def needs_critic(self) -> bool:
        return self.advantage.estimator == "gae"

    @property
    def needs_reference(self) -> bool:
        if self.name == "dpo":  # simpo and orpo are reference-free
            return self.dpo.loss not in ("simpo", "orpo")
        return self.kl.loss_coef > 0 or self.kl.reward_coef > 0

    @property
    def old_logprobs_before_update(self) -> bool:
        """The old log-probs are needed before the update's first forward pass: by a
        later optimizer step of the same batch, or by the KL penalty in the reward."""
        return self.epochs > 1 or self.mini_batches > 1 or self.kl.reward_coef > 0


@dataclass(frozen=True)
class WarmupConfig:
    steps: int = spec(2000, ge=0, help="most SFT steps that make the built-in base policy")
    batch_size: int = spec(64, ge=1, help="SFT samples per step")
    lr: float = spec(1e-3, gt=0, help="SFT learning rate")
    target_accuracy: float = spec(
        0.3, gt=0, le=1, help="stop once greedy accuracy on training prompts reaches this"
    )
    eval_every: int = spec(10, ge=1, help="warm-up steps between accuracy checks")
    shipped: bool = spec(
        True,
        help="start from the pre-warmed weights rlpost ships for these settings where it "
        "ships them (the same base on every machine); false: warm up on this machine",
    )


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = spec(
        None, help="HF model directory or hub id; null builds the built-in tiny model"
    )
    preset: str = spec(
        "tiny",
        help="built-in model when path is null (tiny, small, micro; tiny_vl: a vision-language model)",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = spec(
        "float32", help="trainer and rollout dtype"
    )
    cache_dir: str | None = spec(
        None, help="where the built-in model is cached (null: ~/.cache/rlpost)"
    )
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)
    freeze_vision: bool = spec(
        True,
        help="vision-language models: train the language model only (vision tower and projector frozen)",
    )
    gradient_checkpointing: bool = spec(
        False, help="recompute activations in the backward pass (less memory, ~30% slower)"
    )
    param_offload: bool = spec(
        False, help="FSDP2 CPU offload of parameters, gradients and the optimizer step"
    )
    optimizer_offload: bool = spec(
        False, help="optimizer state on CPU; FSDP2 offers it only with param_offload"
    )


@dataclass(frozen=True)
class PDConfig:
    enabled: bool = spec(
        False,
        help="prefill/decode disaggregation: prefill replicas hand the prompt's KV to decode replicas",
    )
    prefill_replicas: int = spec(1, ge=1, help="KV producers: compute each prompt's KV cache")
    decode_replicas: int = spec(
        1, ge=1, help="KV consumers: load that KV and sample; sessions stick to one by hashing"
    )
    connector: str = spec(
        "ExampleConnector",
        help="vLLM KV connector: ExampleConnector (files in shared_dir, CPU), NixlConnector, MooncakeConnector, ...",
    )
    shared_dir: str | None = spec(
        None,
        help="ExampleConnector's KV directory, on a filesystem every replica sees (null: a temp dir, one node)",
    )
    transfer_backend: Literal["mooncake", "nixl"] = spec(
        "mooncake", help="rollout.name=sglang: --disaggregation-transfer-backend"
    )


@dataclass(frozen=True)
class RolloutConfig:
    lora_sync: Literal["merged", "adapter"] = spec(
        "merged", help="with model.lora: send merged weights, or the adapter itself (vLLM LoRA)"
    )
    weight_sync: Literal["auto", "object_store", "collective", "ipc"] = spec(
        "auto",
        help="how weights reach the replicas: object_store (one copy in Ray's object store), collective (buckets over a process group of their own: gloo on CPU, NCCL on CUDA), ipc (buckets one colocated replica maps: CUDA-IPC handles on a GPU, shared memory on the CPU); auto: collective on CUDA with vLLM, else object_store",
    )
    weight_sync_bucket_mb: float = spec(
        512.0,
        gt=0,
        help="rollout.weight_sync=collective or ipc: bucket size; collective: each side holds one more; ipc: the two share one",
    )
    sleep: Literal["auto", "on", "off"] = spec(
        "auto",
        help="free the replicas' device memory during each update (vLLM sleep mode); auto: on when colocated on an accelerator in sync mode",
    )
    weight_sync_timeout_s: float = spec(
        120.0, gt=0, help="rollout.weight_sync=collective: longest wait of one transfer step"
    )
    name: Literal["vllm", "hf", "sglang"] = spec(
        "vllm",
        help="generation engine (hf: transformers generate, the portable reference; sglang: CUDA only)",
    )
    n: int = spec(8, ge=1, help="samples per prompt (the group size)")
    max_tokens: int = spec(
        8,
        ge=1,
        help="maximum tokens per single-turn completion (agent mode does not read it: a turn's limit is agent.max_turn_tokens)",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = spec(
        "auto",
        help="rollout engine dtype (auto: model.dtype, or bfloat16 under trainer.mixed_precision=bf16, so both sides compute alike)",
    )
    min_tokens: int = spec(
        0,
        ge=0,
        help="no end token before this many tokens (forces long completions, e.g. for benchmarks); vLLM's log-probs then leave the end token out, so sync mode needs rollout.max_logprob_gap=null",
    )
    temperature: float = spec(1.0, ge=0, help="sampling temperature for training rollouts")
    top_p: float = spec(1.0, gt=0, le=1, help="nucleus sampling")
    max_model_len: int = spec(256, ge=16, help="prompt + completion length the engine accepts")
    kv_cache_gib: float = spec(0.25, gt=0, help="KV cache memory per replica (CPU)")
    max_images: int = spec(
        1, ge=1, help="vision-language models: most images in one prompt (sizes vLLM's budget)"
    )
    max_logprob_gap: float | None = spec(
        1e-2,
        gt=0,
        help="sync mode, float32 on both sides: stop when a sampled token's rollout and trainer log-probs differ by more (a weight sync gone wrong; float32 stays under 1e-4; null: no check)",
    )
    max_mean_logprob_gap: float | None = spec(
        5e-2,
        gt=0,
        help="sync mode: stop when the mean gap over the sampled tokens is larger; the check that holds under bf16/fp16, where single tokens differ by 0.1-0.3 from rounding and the mean stays under 0.01 (null: no check)",
    )
    gpu_memory_utilization: float = spec(0.5, gt=0, le=1, help="vLLM memory share on GPU")
    enforce_eager: bool = spec(True, help="disable graph capture (faster start, slower decode)")
    num_cpus: float = spec(1.0, gt=0, help="Ray CPUs reserved by each rollout replica")
    replicas: int = spec(
        1, ge=1, help="rollout replicas behind the router (with pd.enabled: prefill + decode)"
    )
    cpu_threads_bind: str | int = spec(
        "auto",
        help="CPU: cores for vLLM's threads, e.g. '1' or '0-3' ('auto': all); one core leaves the rest to the trainer in one_step_off mode",
    )
    block_size: int | None = spec(
        None,
        ge=1,
        help="KV-cache block in tokens; the prefix cache reuses whole blocks, a PD connector moves them (null: 32 with pd.enabled on vLLM, else vLLM's default, 128 on CPU)",
    )
    pd: PDConfig = field(default_factory=PDConfig)


@dataclass(frozen=True)
class MegatronConfig(MegatronParallel):
    """``trainer.megatron``: the engine's split of the model over ranks, and the
    data-parallel size that sets ``trainer.world_size`` when that is not given."""

    dp: int = spec(
        0,
        ge=0,
        help="data-parallel size; 0: trainer.world_size / (tp x pp x cp), or 1 when "
        "trainer.world_size is not given either",
    )


@dataclass(frozen=True)
class TrainerConfig:
    name: Literal["fsdp", "megatron"] = spec(
        "fsdp", help="training engine: fsdp (FSDP2) or megatron (megatron-core, trainer.megatron.*)"
    )
    total_steps: int = spec(200, ge=0, help="RL steps")
    val_every: int = spec(20, ge=0, help="validate every N steps (0: only at start and end)")
    val_n: int = spec(
        1,
        ge=1,
        help="validation samples per held-out prompt: 1 validates greedily only; more also samples that many at rollout.temperature and logs val/mean@n, val/pass@k, val/maj@<val_n> (docs/evaluation.md)",
    )
    log_samples: int = spec(
        0,
        ge=0,
        help="write this many samples a step (prompt, completion or episode, rewards, advantage, length, finish reason, policy version) to run_dir/samples/step_XXXXXX.jsonl and validation generations to samples/val_XXXXXX.jsonl; a wandb table too (0: none)",
    )
    trace: bool | Literal["off", "steps", "full"] = spec(
        "steps",
        help="the run timeline, run_dir/trace.json (Chrome trace events: ui.perfetto.dev, chrome://tracing; the board's timeline page): steps records the controller's named steps, trainer calls, rollout requests (queued, prefill, decode) and weight syncs (under 2 % of a step, docs/timeline.md); full adds each micro-batch's forward and backward and the optimizer; off or false records nothing (true: steps)",
    )
    run_dir: str | None = spec(None, help="outputs directory (null: outputs/<time>-<algo>)")
    seed: int = spec(0, help="seed for data order, model init and sampling")
    logger: list[Literal["console", "jsonl", "wandb"]] = spec(
        ["console", "jsonl"], help="metric sinks; wandb runs offline without a network"
    )
    world_size: int = spec(
        0,
        ge=0,
        help="ranks of the training worker group; 0: follows from the layout (1 for fsdp; "
        "tp x pp x cp x megatron.dp for megatron)",
    )
    device: Literal["auto", "cpu", "cuda", "npu"] = spec("auto", help="training device")
    num_cpus_per_worker: float = spec(1.0, gt=0, help="Ray CPUs per training rank")
    placement: Literal["colocated", "separate"] = spec(
        "colocated",
        help="colocated: one Ray placement group for trainer ranks and rollout; separate: one per role",
    )
    placement_strategy: Literal["pack", "spread", "strict_pack", "strict_spread"] = spec(
        "pack",
        help="pack: few nodes, spilling onto more when one is not enough; spread: even; strict_*: no fallback",
    )
    placement_timeout_s: float = spec(
        300.0,
        gt=0,
        help="seconds to wait for resources other jobs hold (a placement larger than the cluster fails at once)",
    )
    lr: float = spec(1e-4, gt=0, help="AdamW learning rate")
    lr_warmup_steps: int = spec(10, ge=0, help="linear learning-rate warm-up steps")
    lr_schedule: Literal["constant", "linear", "cosine"] = spec(
        "constant",
        help="the learning rate after the warm-up: constant, or a linear or cosine decay over the run's optimizer steps (trainer.total_steps x algo.epochs x algo.mini_batches) to trainer.lr_min_ratio x lr",
    )
    lr_min_ratio: float = spec(
        0.0, ge=0, le=1, help="the floor a decaying trainer.lr_schedule ends at, as a share of lr"
    )
    weight_decay: float = spec(0.0, ge=0, help="AdamW weight decay")
    betas: list[float] = spec([0.9, 0.99], help="AdamW betas")
    max_grad_norm: float = spec(1.0, gt=0, help="gradient clipping norm")
    micro_batch_size: int = spec(64, ge=1, help="samples per forward/backward on each rank")
    threads: int | Literal["auto"] = spec(
        "auto",
        ge=1,
        help="torch threads per trainer rank and rollout replica (auto, on the CPU: the trainer ranks share every core in every mode; replicas share them in sync mode and keep rollout.num_cpus each in one_step_off and fully_async; accelerators: 1)",
    )
    async_mode: Literal["sync", "one_step_off", "fully_async"] = spec(
        "sync",
        help="sync: generate, then train; one_step_off: generate the next batch while training on this one; fully_async: rollouts stream for the whole run within a staleness bound (async.*)",
    )
    save_final: bool = spec(True, help="write the final policy in HF format to run_dir/final")
    save_best: bool = spec(
        False,
        help="also keep the policy at its best held-out headline so far (val/accuracy, pair accuracy; val/nll lowest) in HF format in run_dir/best, with best.json naming the step and value",
    )
    critic_lr: float = spec(1e-4, gt=0, help="PPO critic learning rate")
    critic_warmup: int = spec(0, ge=0, help="PPO: steps that train only the critic")
    max_bad_steps: int = spec(
        3, ge=1, help="stop after this many steps in a row whose update was skipped for NaN/Inf"
    )
    save_every: int = spec(
        50, ge=0, help="checkpoint every N steps and at the last step (0 = never)"
    )
    keep_last: int = spec(2, ge=1, help="checkpoints kept in run_dir/checkpoints")
    resume: str = spec(
        "auto", help="auto (latest checkpoint in run_dir, if any), none, or a checkpoint path"
    )
    max_restarts: int = spec(
        1,
        ge=0,
        help="times a run rebuilds its trainer groups from the last checkpoint after a rank dies",
    )
    micro_batch_tokens: int = spec(
        0, ge=0, help="token budget per micro-batch (0 = micro_batch_size samples)"
    )
    packing: bool = spec(
        False, help="pack each micro-batch into one row without padding (same result)"
    )
    prefix_sharing: Literal["off", "on", "auto"] = spec(
        "off",
        help="fsdp: the samples of a micro-batch that begin alike (a prompt's rollout.n samples, an agent episode's segments) run their common prefix once, through an attention mask (same result; docs/prefix-sharing.md). auto: where it saves a fifth of the micro-batch's tokens and the model's attention allows it; on: always, an error where it cannot",
    )
    mixed_precision: Literal["none", "bf16"] = spec(
        "none",
        help="bf16 compute with fp32 master weights and reductions (GPUs; CPUs with bf16 instructions, e.g. avx512_bf16 or AMX, train ~2.5x faster)",
    )
    compile: bool = spec(
        False,
        help="fsdp: torch.compile each decoder layer and the log-prob kernels, fusing the element-wise work between matrix products (for accelerators; same result within rounding). The first micro-batch of each new shape compiles first: tens of seconds",
    )
    ulysses: int = spec(
        1,
        ge=1,
        help="Ulysses sequence parallelism (fsdp): ranks that share each sample, each holding 1/N of its tokens, with attention heads traded by all-to-all; trainer.world_size / N is the data-parallel size",
    )
    megatron: MegatronConfig = field(default_factory=MegatronConfig)


@dataclass(frozen=True)
class AgentConfig:
    tools: list[str] = spec(
        [],
        help="tools the model may call: built-in names (calculator, multiply, python), file.py:fn or module:fn, or mcp:<server.py or URL> for every tool of an MCP server (sessions: agent.mcp_sessions)",
    )
    env: str | None = spec(
        None, help="environment class (file.py:Class or module:Class), one instance per episode"
    )
    env_kwargs: dict[str, Any] = spec({}, help="keyword arguments of the environment's constructor")
    parser: str = spec("hermes", help="tool-call format in the model's text (hermes: <tool_call>)")
    max_turns: int = spec(4, ge=1, help="model turns per episode")
    max_response_tokens: int = spec(
        192, ge=1, help="model + environment tokens per episode after the prompt (agent/truncated)"
    )
    max_turn_tokens: int | None = spec(
        None,
        ge=1,
        help="tokens per model turn; a turn that reaches it counts in response/clip_ratio (null: what the episode's max_response_tokens leaves; rollout.max_tokens is for single-turn completions)",
    )
    tool_timeout_s: float = spec(10.0, gt=0, help="a tool call running longer is stopped")
    mcp_sessions: str = spec(
        "episode",
        choices=("episode", "run"),
        help="mcp: tools' sessions: episode (one per episode and server; a script server is a process per episode) or run (one per server and rollout worker, shared by every episode: for servers that keep no state between calls)",
    )
    tool_latency_s: list[float] = spec(
        [],
        help="[lo, hi]: each turn that calls agent.tools first waits a uniform random time in that range, in seconds (a slow tool or API, for benchmarks); []: none",
    )

    program: str | None = spec(
        None,
        help="your own agent, file.py:fn or module:fn: (async) fn(client, row) gets an OpenAI client bound to its episode on rlpost's chat endpoint and returns the reward (a number), or None / the final answer for reward.fn; it runs the episodes instead of the built-in loop",
    )
    program_timeout_s: float = spec(
        300.0,
        gt=0,
        help="an agent program's episode running longer ends with reward 0 (agent/program_timeouts)",
    )
    max_concurrent_episodes: int = spec(
        0, ge=0, help="most agent-program episodes running at once (0: every episode of a batch)"
    )
    train_segments: Literal["all", "last"] = spec(
        "all",
        help="an agent program's trajectory split at a prefix break (agent/prefix_breaks): all trains every segment as a sample of its episode with the episode's reward and advantage; last trains only the segment that holds the final answer (the rest counted in agent/dropped_tokens)",
    )
    endpoint_host: str = spec(
        "127.0.0.1", help="address the agent programs' OpenAI-compatible endpoint listens on"
    )
    endpoint_port: int = spec(0, ge=0, le=65535, help="its port (0: any free one)")

    @property
    def enabled(self) -> bool:
        """Multi-turn episodes instead of single completions: set by tools, an env or a program."""
        return bool(self.tools) or self.env is not None or self.program is not None


@dataclass(frozen=True)
class AsyncConfig:
    """``trainer.async_mode=fully_async``: the producer, its staleness bound and
    partial rollout (the group is ``async``, a Python keyword, held as ``async_``)."""

    max_staleness: int = spec(
        1,
        ge=0,
        help="most updates the oldest token of a trained sample may lag the trainer (0 reproduces sync); new groups wait rather than break it, samples past it anyway are dropped (async/dropped_stale)",
    )
    max_inflight: int | Literal["auto"] = spec(
        0,
        ge=0,
        help="most prompt groups generating at once (0: 2 x data.prompts_per_step); the staleness bound may allow fewer. auto: steered each step, grown while the trainer waits and the replicas' KV cache has room, trimmed (youngest groups cancelled first, async/trimmed_groups) when the engines preempt requests or groups go stale (docs/async.md)",
    )
    partial_rollout: bool = spec(
        True,
        help="after an update, stop requests in flight and continue them under the new weights (false: they finish under the old ones first)",
    )


@dataclass(frozen=True)
class Config:
    algo: AlgoConfig
    model: ModelConfig
    rollout: RolloutConfig
    trainer: TrainerConfig
    data: DataConfig
    reward: RewardConfig
    agent: AgentConfig = field(default_factory=AgentConfig)
    async_: AsyncConfig = field(default_factory=AsyncConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)


SCHEMAS: dict[str, type] = {
    "algo": AlgoConfig,
    "model": ModelConfig,
    "rollout": RolloutConfig,
    "trainer": TrainerConfig,
    "data": DataConfig,
    "reward": RewardConfig,
    "agent": AgentConfig,
    "async": AsyncConfig,
    "eval": EvalConfig,
    "teacher": TeacherConfig,
}
# Groups whose Config field is named differently (a Python keyword).
FIELDS = {"async": "async_"}
# Groups that may be left out of a config (newer than the rest; they have defaults).
OPTIONAL_GROUPS = ("agent", "async", "eval", "teacher")
