"""The task side of the run config: the data a run trains on (``data``), how its
samples are scored (``reward``: functions, a reward model, a judge; ``teacher``:
``algo=opd``'s teacher, which scores them token by token) and how a trained model
is evaluated (``eval``). The other groups and ``Config`` are in
``rlpost.config.groups``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlpost.config.schema import spec


@dataclass(frozen=True)
class ReasoningGymConfig:
    """``data.name=reasoning_gym``: which of reasoning-gym's generators, how many rows."""

    datasets: list[str] = spec([], help="reasoning-gym dataset names, e.g. [chain_sum, countdown]")
    size: int = spec(1000, ge=1, help="training rows in all, shared by the datasets' weights")
    weights: dict[str, float] = spec(
        {}, help="relative share of each dataset's rows (default 1 each)"
    )
    seed: int | None = spec(None, help="the generators' seed (null: trainer.seed)")
    config: dict[str, dict[str, Any]] = spec(
        {}, help="per dataset, its generator's keyword arguments, e.g. {chain_sum: {min_terms: 2}}"
    )
    system_prompt: str | None = spec(
        None,
        help="one of reasoning-gym's system prompts (e.g. default: answer in <answer> tags), or null for none",
    )


@dataclass(frozen=True)
class DataConfig:
    name: Literal[
        "arith", "arith_pref", "calc", "shapes", "files", "reasoning_gym", "verifiers"
    ] = spec(
        "arith",
        help="built-in task (arith: a+b=; arith_pref: its preference pairs, for algo=dpo and algo=rm; calc: a*b= with a multiply tool; shapes: a picture's colour, for VL models), reasoning-gym's generators, the tasks of agent.program=verifiers:<taskset>, or user files",
    )
    train_files: list[str] = spec(
        [],
        help="JSONL or Parquet files (globs too, e.g. data/train-*.parquet) or folders saved by datasets' save_to_disk, with a 'prompt' column (or data.prompt_key / data.prompt_template)",
    )
    val_files: list[str] = spec([], help="held-out files, in the same forms")
    prompt_key: str = spec(
        "prompt", help="data=files: the column holding the prompt (a string or chat messages)"
    )
    answer_key: str = spec("answer", help="data=files: the column the rewards read as 'answer'")
    prompt_template: str | None = spec(
        None,
        help="data=files: build the prompt from the row's columns, e.g. '{question} Put the final answer after ####.' ({{ and }}: literal braces)",
    )
    system_prompt: str | None = spec(
        None, help="data=files: a system message before every prompt that has none"
    )
    prompts_per_step: int = spec(32, ge=1, help="prompts per RL step (batch = this x rollout.n)")
    curriculum: Literal["none", "pool", "gate"] = spec(
        "none",
        help="none: every prompt in turn; pool: skip prompts whose last data.curriculum_window groups all scored alike (always solved or never), each returning with probability data.curriculum_return when its turn comes; gate: pool, and a group whose rewards all agree is not trained and another is generated in its place (as algo.dynamic_sampling, up to its max_rounds). RL algorithms only (docs/data-and-rewards.md)",
    )
    curriculum_window: int = spec(
        2, ge=1, help="data.curriculum: the groups of a prompt that must all agree to skip it"
    )
    curriculum_return: float = spec(
        0.1,
        ge=0,
        le=1,
        help="data.curriculum: the chance a skipped prompt is generated anyway when its turn comes",
    )
    val_size: int = spec(200, ge=1, help="held-out prompts scored at each validation")
    max_operand: int = spec(
        99, ge=1, help="built-in tasks: operands go up to max_operand (arith from 0, calc from 10)"
    )
    max_prompt_tokens: int = spec(64, ge=1, help="longer prompts are dropped and counted")
    reasoning_gym: ReasoningGymConfig = field(default_factory=ReasoningGymConfig)


@dataclass(frozen=True)
class RewardModelConfig:
    """``reward.model.path``: a discriminative reward model scoring each sample."""

    path: str | None = spec(
        None,
        help="a local HF folder of an AutoModelForSequenceClassification with one label and a chat template (Skywork-Reward style); its score is a named reward (null: none)",
    )
    name: str = spec(
        "reward_model", help="its score's name: reward.weights.<name>, reward/<name>/mean"
    )
    batch_size: int = spec(16, ge=1, help="samples per forward pass")
    max_length: int = spec(
        2048,
        ge=1,
        help="longer rendered prompt + completion are cut to their first this many tokens",
    )
    num_cpus: float = spec(1.0, gt=0, help="Ray CPUs of its worker")
    dtype: Literal["float32", "bfloat16"] = spec("float32", help="its weights' dtype")


@dataclass(frozen=True)
class RewardJudgeConfig:
    """``reward.judge.path``: a generative judge on a rollout engine of its own."""

    path: str | None = spec(
        None,
        help="a local HF folder of a causal LM with a chat template that grades each sample; its parsed verdict is a named reward (null: none)",
    )
    name: str = spec("judge", help="its score's name: reward.weights.<name>, reward/<name>/mean")
    template: str = spec(
        "Grade the answer to the question from 0 (wrong) to 10 (right).\nQuestion: {prompt}\nReference answer: {answer}\nAnswer: {completion}\nReply with 'Score: <number>'.",
        help="the judge's prompt: {prompt}, {completion}, {answer} and any {column} of the row ({{ }}: literal braces)",
    )
    parse: str = spec(
        "Score:\\s*(-?\\d+(?:\\.\\d+)?)",
        help="the verdict to a score: a regular expression (its group, or the match, as a number) or file.py:fn returning a float or None; an unparsable verdict is an error, scored 0",
    )
    max_tokens: int = spec(64, ge=1, help="verdict tokens")
    temperature: float = spec(0.0, ge=0, help="the judge's sampling temperature (0: greedy)")
    max_model_len: int | None = spec(
        None, ge=16, help="prompt + verdict length its engine accepts (null: rollout.max_model_len)"
    )
    num_cpus: float = spec(1.0, gt=0, help="Ray CPUs of its engine")


@dataclass(frozen=True)
class RewardConfig:
    fn: str | list[str] = spec(
        "arith",
        help="reward function: a built-in name (arith, math, gsm8k, code, ...), 'file.py:function' or 'module:function'; a list of them sums their scores by reward.weights",
    )
    weights: dict[str, float] = spec(
        {},
        help="weights of the named rewards in the total: a function's name, or the keys of one that returns a dict (unweighted names: the function's default_weights, else 1.0)",
    )
    num_workers: int = spec(
        2, ge=0, help="processes that score completions concurrently (0: in the driver, no timeout)"
    )
    timeout_s: float = spec(
        30.0, gt=0, help="a reward call running longer is stopped, scored 0 and counted"
    )
    max_error_frac: float = spec(
        0.5, ge=0, le=1, help="stop the run when more than this share of a step's reward calls fail"
    )
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    judge: RewardJudgeConfig = field(default_factory=RewardJudgeConfig)


@dataclass(frozen=True)
class EvalConfig:
    """``python -m rlpost.eval``: samples per prompt and the metrics drawn from them
    (``rlpost.evaluation``)."""

    n: int = spec(
        16, ge=1, help="sampled completions per prompt (mean@n, pass@k and maj@k use them)"
    )
    k: list[int] = spec([1], help="the k of pass@k and maj@k, each <= eval.n (e.g. [1,4,16])")
    temperature: float = spec(1.0, ge=0, help="sampling temperature of the n samples")
    top_p: float = spec(1.0, gt=0, le=1, help="nucleus sampling of the n samples")
    greedy: bool = spec(True, help="also one temperature-0 completion per prompt (greedy accuracy)")
    correct_threshold: float = spec(
        1.0,
        help="a sample counts as correct (pass@k, maj@k) when its score is >= this; the score is the reward's 'correctness' when it returns one, else the total (also trainer.val_n's)",
    )
    output: str | None = spec(
        None,
        help="folder for eval.json and eval.md (null: <model.path>/eval for a local model, else outputs/eval-<time>)",
    )
    max_prompts: int = spec(0, ge=0, help="evaluate the first this many held-out rows (0: all)")


@dataclass(frozen=True)
class TeacherConfig:
    """``algo=opd``: the model whose log-probs the student's samples are distilled
    towards, run as a frozen trainer group placed like the reference policy."""

    path: str | None = spec(
        None,
        help="algo=opd: the teacher's HF model directory or hub id (e.g. a GRPO run's run_dir/final); it may be larger than the student, but its tokenizer's vocabulary must be the student's",
    )
