"""FSDP2 critic engine for PPO: the policy's transformer with a scalar value head.

Legend: b = samples, t = tokens, h = hidden size.

Values, updates and checkpoints are ``rlpost.trainers.critic``'s, shared with
the Megatron critic; this module builds the value model and its backend.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlpost.runtime.device import upload
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.critic import CriticUpdates
from rlpost.trainers.distributed import init_distributed
from rlpost.trainers.engine_config import torch_dtype
from rlpost.trainers.fsdp.common import FSDPBackend, shard
from rlpost.trainers.fsdp.engine import FSDPEngineConfig
from rlpost.trainers.fsdp.state import FSDPState
from rlpost.trainers.fsdp.ulysses import ATTENTION as ULYSSES_ATTENTION
from rlpost.trainers.fsdp.ulysses import SequenceParallel
from rlpost.trainers.micro_batching import micro_batches, padded_rows
from rlpost.trainers.prefix_sharing import PrefixSharing


class ValueModel(torch.nn.Module):
    """A transformer body (from the policy checkpoint) and a zero-initialised value head."""

    def __init__(self, body: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.body = body
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The head on each position's hidden state (b, t), not yet shifted."""
        h_bth = self.body(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state
        return self.value_head(h_bth.float()).squeeze(-1)


class CriticEngine(CriticUpdates):
    def __init__(self, cfg: FSDPEngineConfig, rank: int, world_size: int, init_method: str):
        from transformers import AutoModel

        torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = init_distributed(cfg.device, cfg.backend, rank, world_size, init_method)
        cfg.check()
        body = AutoModel.from_pretrained(cfg.model_path, dtype=torch_dtype(cfg.dtype))
        if cfg.gradient_checkpointing:
            body.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        self.sp = None
        if cfg.ulysses > 1:
            self.sp = SequenceParallel(cfg.ulysses, rank, world_size)
            body.set_attn_implementation(ULYSSES_ATTENTION)
        self._sharing = PrefixSharing(cfg.prefix_sharing, body.config, self.sp is not None, False)
        model = ValueModel(body, body.config.hidden_size).to(self.device)
        shard(model, body.layers, offload=cfg.param_offload, mixed_precision=cfg.mixed_precision)
        self.model = model
        self.num_params = sum(p.numel() for p in model.parameters())
        backend = FSDPBackend(
            model, world_size, self._micro_batches, self._values, cfg, self.sp, cfg.param_offload
        )
        state = FSDPState(model, backend.optimizer, backend.scheduler, cfg, rank, world_size, False)
        super().__init__(backend, lambda v_bt: v_bt, state)

    def _micro_batches(self, batch: TrajectoryBatch) -> list[TrajectoryBatch]:
        # The critic always runs padded; a token budget still shapes its micro-batches.
        return micro_batches(batch, self.cfg.micro_batch_size, self.cfg.micro_batch_tokens)

    def _values(self, mb: TrajectoryBatch) -> torch.Tensor:
        """V (b, t): ``values_bt[:, t]`` is V(state before token t), read from the
        hidden state at position t-1, so each response token's state sits under its mask.
        Under ``trainer.ulysses`` each rank runs its slice of the tokens, and the
        slices' values are gathered. A shared prefix (``prefix_sharing``) runs once
        for the samples that begin with it."""
        shared = self._sharing.rows(mb)
        if shared is not None:
            dtype = next(self.model.parameters()).dtype
            v_T = shared.gather(self.model(**self._sharing.inputs(shared, dtype, self.device)))[0]
            v_bt = padded_rows(v_T, shared.lengths, mb.input_ids_bt.shape[1])
        elif self.sp is None:
            ids, mask = (
                upload(mb.input_ids_bt, self.device),
                upload(mb.attention_mask_bt, self.device),
            )
            v_bt = self.model(ids, mask)
        else:
            width = mb.input_ids_bt.shape[1]
            ids_bl, pos_bl, _ = self.sp.inputs(mb.input_ids_bt, None)
            with self.sp.attending(None):
                v_bl = self.model(
                    upload(ids_bl, self.device), position_ids=upload(pos_bl, self.device)
                )
            v_bt = self.sp.gather(v_bl)[:, :width]
        return F.pad(v_bt[:, :-1], (1, 0))

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
