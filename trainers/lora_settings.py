"""LoRA's settings: the run config's ``model.lora`` group and what the FSDP2 engine
takes (``rlpost.trainers.fsdp.lora`` wraps the model with them). Light on purpose:
the config imports it, and PEFT only when a model is wrapped."""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.algos.spec import check, spec


@dataclass(frozen=True)
class LoraSettings:
    rank: int = spec(0, ge=0, help="LoRA rank (0 = off: full fine-tuning)")
    alpha: float = spec(16.0, gt=0, help="LoRA scaling numerator: the update is (alpha / rank) B A")
    dropout: float = spec(0.0, ge=0, le=1, help="dropout on the LoRA input")
    target_modules: str | tuple[str, ...] = spec(
        "all-linear",
        help="'all-linear' (every nn.Linear of the language model: not the head, a vision "
        "tower or fused MoE experts) or module names",
    )

    def __post_init__(self) -> None:
        check(self)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        """PEFT's scale of the update: W + (alpha / r) B A."""
        return self.alpha / self.rank

    def peft_config(self, base_model_path: str | None = None):
        from peft import LoraConfig

        targets = self.target_modules
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,  # type: ignore[arg-type]
            lora_dropout=self.dropout,
            target_modules=targets if isinstance(targets, str) else list(targets),
            task_type="CAUSAL_LM",
            base_model_name_or_path=base_model_path,
        )
