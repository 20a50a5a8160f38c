"""FSDP2 reward-model engine (``algo=rm``): the policy checkpoint's transformer with a
one-label sequence-classification head, trained with the Bradley-Terry loss.

Legend: b = samples, t = tokens.

The model is transformers' ``AutoModelForSequenceClassification`` built from the
policy's checkpoint (its backbone loaded, the ``score`` head new), so the final
model saved by ``save_hf`` is what ``reward.model.path`` loads: the score of a
sample is the head's output at its last non-padding token, as
``rlpost.rewards.reward_model.SequenceRewardModel`` reads it.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from rlpost.runtime.device import upload
from rlpost.runtime.hf_format import save_preprocessing
from rlpost.trainers import checkpointing
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.distributed import init_distributed
from rlpost.trainers.engine_config import torch_dtype
from rlpost.trainers.files import atomic_directory
from rlpost.trainers.fsdp.common import FSDPBackend, shard
from rlpost.trainers.fsdp.engine import FSDPEngineConfig
from rlpost.trainers.fsdp.lora import decoder_layers
from rlpost.trainers.fsdp.state import FSDPState
from rlpost.trainers.micro_batching import micro_batches
from rlpost.trainers.preference import reward_model_loss
from rlpost.trainers.update import step


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


class RewardModelEngine:
    """Scores (``rewards``), Bradley-Terry steps (``update_reward_model``), the HF
    folder (``save_hf``) and checkpoints of one rank's reward model."""

    def __init__(self, cfg: FSDPEngineConfig, rank: int, world_size: int, init_method: str):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        cfg.check()
        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = init_distributed(cfg.device, cfg.backend, rank, world_size, init_method)
        pad_id = AutoTokenizer.from_pretrained(cfg.model_path).pad_token_id
        model = AutoModelForSequenceClassification.from_pretrained(
            cfg.model_path, num_labels=1, dtype=torch_dtype(cfg.dtype), pad_token_id=pad_id
        )
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model.to(self.device)  # type: ignore[arg-type]
        shard(
            model,
            decoder_layers(model),
            offload=cfg.param_offload,
            mixed_precision=cfg.mixed_precision,
        )
        self.model = model
        self.num_params = sum(p.numel() for p in model.parameters())
        self.backend = FSDPBackend(
            model,
            world_size,
            self._micro_batches,
            self._scores,
            cfg,
            offload=cfg.param_offload,
        )
        self.state = FSDPState(
            model, self.backend.optimizer, self.backend.scheduler, cfg, rank, world_size, False
        )

    def _micro_batches(self, batch: TrajectoryBatch) -> list[TrajectoryBatch]:
        return micro_batches(batch, self.cfg.micro_batch_size)

    def _scores(self, mb: TrajectoryBatch) -> torch.Tensor:
        """r (b,): the head at each row's last non-padding token (float32)."""
        ids = upload(mb.input_ids_bt, self.device)
        mask = upload(mb.attention_mask_bt, self.device)
        return self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, 0].float()

    @torch.no_grad()
    def rewards(self, batch: TrajectoryBatch) -> torch.Tensor:
        """r (b,) of this rank's samples."""

        def collect(mb: TrajectoryBatch, r_b: torch.Tensor):
            return torch.zeros(()), r_b[:, None]

        return self.backend.forward(batch, collect, grad=False)[:, 0]

    def update_reward_model(
        self, batch: TrajectoryBatch, *, center_coef: float = 0.0
    ) -> dict[str, float]:
        """One Bradley-Terry step over interleaved (chosen, rejected) pairs; global
        metrics ``rm/loss``, ``rm/accuracy``, ``rm/margin``. Collective."""
        start = time.perf_counter()
        out = step(self.backend, batch, reward_model_loss(lambda r_b: r_b, center_coef), 1.0, "rm")
        metrics = out[0]
        metrics["timing/update_s"] = time.perf_counter() - start
        return metrics

    def has_dropout(self) -> bool:
        return any(
            isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.model.modules()
        ) or bool(getattr(self.model.config, "attention_dropout", 0.0))

    def save_hf(self, out_dir: str, tokenizer_dir: str | None = None) -> str | None:
        """The reward model as an HF folder (weights, config with one label, the
        tokenizer and its chat template), written atomically by rank 0. Collective."""
        state = {k: _full(v).detach().cpu() for k, v in self.model.state_dict().items()}
        if self.rank != 0:
            return None
        from transformers import AutoConfig, AutoModelForSequenceClassification

        config = AutoConfig.from_pretrained(self.cfg.model_path, num_labels=1)
        config.pad_token_id = self.model.config.pad_token_id
        with torch.device("meta"):
            model = AutoModelForSequenceClassification.from_config(config)
        model.load_state_dict(state, assign=True, strict=False)
        if getattr(config, "tie_word_embeddings", False) and hasattr(model, "tie_weights"):
            model.tie_weights()
        with atomic_directory(out_dir) as tmp:
            model.save_pretrained(tmp)
            save_preprocessing(tokenizer_dir or self.cfg.model_path, tmp)
        return str(out_dir)

    def save_checkpoint(self, path: str) -> str:
        return checkpointing.save(path, self.state)

    def load_checkpoint(self, path: str) -> None:
        checkpointing.load(path, self.state)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
