"""Megatron-core policy engine: log-probs, policy/SFT updates, HF-named weight export,
with tensor (``tp``), pipeline (``pp``) and expert (``ep``) parallelism and data
parallelism over the remaining ranks.

Legend: b = samples, t = tokens, v = vocab.

The engine has ``FSDPEngine``'s interface, so the worker shells and the
controller drive either one alike. What differs inside:

- **Data.** The worker group hands every rank an equal share of the batch, as
  for FSDP. The ranks of one model-parallel group (tp x pp ranks that hold one
  copy of the model between them) must all see the same samples, so each
  engine call first gathers its group's shares into one data-parallel batch,
  and each rank returns the rows it was given (``schedule.dp_batch``).
- **Model and steps** are ``model.MegatronModel``'s: megatron-core's
  ``GPTModel`` converted from the HF checkpoint, every forward and backward
  through megatron's schedule, globally normalised losses.
- **Losses** are ``rlpost.trainers.objectives`` (the ``algos`` functions), the same
  as the FSDP engine's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from rlpost.algos import LossNorm, PolicyLossConfig, entropy_from_logits, sft_loss
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.files import atomic_directory
from rlpost.trainers.fsdp.common import pack, run_epochs, unpack
from rlpost.trainers.fsdp.engine import RegularizerConfig, token_logprobs
from rlpost.trainers.megatron import checkpoint, cpu_shim
from rlpost.trainers.megatron.config import (  # noqa: F401  (the engine's public names)
    MegatronEngineConfig,
    MegatronParallel,
    check_divisible,
)
from rlpost.trainers.megatron.convert import megatron_to_hf
from rlpost.trainers.megatron.model import MegatronModel
from rlpost.trainers.megatron.schedule import dp_batch, from_last_stage, rows_from_last_stage
from rlpost.trainers.objectives import check_policy_batch, policy_objective

# A policy micro-batch loss: log-probs (b, t), entropies (b, t) or None -> (loss, metrics).
PolicyMicroLoss = Callable[
    [TrajectoryBatch, torch.Tensor, torch.Tensor | None, LossNorm],
    tuple[torch.Tensor, dict[str, float]],
]


class MegatronEngine:
    @cpu_shim.runs_on_cpu
    def __init__(self, cfg: MegatronEngineConfig, rank: int, world_size: int, init_method: str):
        self.m = MegatronModel(cfg, rank, world_size, init_method)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.shape, self.num_params = self.m.shape, self.m.num_params

    # -- forward passes -----------------------------------------------------------------
    def _token_stats(
        self, mb: TrajectoryBatch, logits: torch.Tensor, temperature: float, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (b, t) and, if asked, entropies (b, t) from the model's logits."""
        logits = logits.float() / temperature
        width = mb.input_ids_bt.shape[1]
        ids = pack(mb)[0] if self.cfg.packing else mb.input_ids_bt
        logp = token_logprobs(logits, ids)
        ent = F.pad(entropy_from_logits(logits[:, :-1]), (1, 0)) if entropy else None
        if self.cfg.packing:
            lengths = [int(n) for n in mb.attention_mask_bt.sum(dim=1).tolist()]
            logp = unpack(logp, lengths, width)
            ent = unpack(ent, lengths, width) if ent is not None else None
        return logp, ent

    @cpu_shim.runs_on_cpu
    @torch.no_grad()
    def logprobs(
        self, batch: TrajectoryBatch, temperature: float = 1.0, disable_adapter: bool = False
    ) -> torch.Tensor:
        """Log-probs (b, t) of this rank's batch under the current weights (0 off the response)."""
        if disable_adapter:
            raise ValueError("disable_adapter=True: the Megatron engine has no LoRA")
        m = self.m
        m.eval()
        data, mine = dp_batch(batch, m.mpu)
        mbs = m.micro_batches(data)

        def collect(mb, logits):
            return torch.zeros(()), self._token_stats(mb, logits, temperature, False)[0]

        results = m.run(mbs, collect)
        out = rows_from_last_stage(
            mbs, results, data.input_ids_bt.shape, m.mpu, self.cfg.parallel.pp
        )
        return out[mine] * batch.response_mask_bt

    @cpu_shim.runs_on_cpu
    @torch.no_grad()
    def greedy_match(self, batch: TrajectoryBatch) -> torch.Tensor:
        """(b,) bool: every response token is the argmax given the tokens before it."""
        m = self.m
        m.eval()
        data, mine = dp_batch(batch, m.mpu)
        mbs = m.micro_batches(data, self.cfg.micro_batch_size)

        def hits(mb, logits):
            hit_bt = logits[:, :-1].argmax(-1) == mb.input_ids_bt[:, 1:]
            resp_bt = mb.response_mask_bt[:, 1:].bool()
            return torch.zeros(()), (hit_bt | ~resp_bt).all(dim=1)

        results = m.run(mbs, hits)
        out = torch.cat(results).float() if m.last_stage else torch.zeros(len(data))
        return from_last_stage(out, m.mpu, self.cfg.parallel.pp)[mine].bool()

    # -- updates ------------------------------------------------------------------------
    def _step(
        self,
        batch: TrajectoryBatch,
        loss_fn: PolicyMicroLoss,
        norm_const: float,
        prefix: str,
        temperature: float = 1.0,
        record: list[torch.Tensor] | None = None,
    ) -> tuple[dict[str, float], torch.Tensor]:
        """``MegatronModel.step`` with the loss of the logits' log-probs and entropies."""

        def on_logits(mb, logits, norm):
            logp, entropy = self._token_stats(mb, logits, temperature, True)
            return loss_fn(mb, logp, entropy, norm)

        return self.m.step(batch, on_logits, norm_const, prefix, record)

    def _policy_loss(
        self,
        loss_cfg: PolicyLossConfig,
        reg: RegularizerConfig | None,
        is_cap: float | None,
        record: list[torch.Tensor] | None,
    ) -> PolicyMicroLoss:
        """The micro-batch policy loss. ``record`` None: old log-probs from the batch;
        a list: the forward's own, detached, each micro-batch's appended to it."""
        reg = reg or RegularizerConfig()

        def loss_fn(mb, logp, entropy, norm):
            if record is None:
                if mb.old_logp_bt is None:
                    raise ValueError("update_policy needs old_logp_bt in the batch")
                old = mb.old_logp_bt
            else:
                old = logp.detach()
                record.append(old)
            return policy_objective(logp, entropy, old, mb, loss_cfg, reg, norm, is_cap)

        return loss_fn

    @cpu_shim.runs_on_cpu
    def update_policy(
        self,
        batch: TrajectoryBatch,
        loss_cfg: PolicyLossConfig,
        *,
        temperature: float = 1.0,
        epochs: int = 1,
        mini_batches: int = 1,
        norm_const: float = 1.0,
        reg: RegularizerConfig | None = None,
        is_cap: float | None = None,
    ) -> dict[str, float]:
        """Policy-gradient update on this rank's share; returns global metrics."""
        check_policy_batch(batch, reg or RegularizerConfig())
        if batch.old_logp_bt is None:
            raise ValueError("update_policy needs old_logp_bt in the batch")
        loss_fn = self._policy_loss(loss_cfg, reg, is_cap, None)
        start = time.perf_counter()
        out = run_epochs(
            lambda mini: self._step(mini, loss_fn, norm_const, "actor", temperature)[0],
            batch,
            epochs,
            mini_batches,
        )
        out["timing/update_s"] = time.perf_counter() - start
        return out

    @cpu_shim.runs_on_cpu
    def update_policy_single_pass(
        self,
        batch: TrajectoryBatch,
        loss_cfg: PolicyLossConfig,
        *,
        temperature: float = 1.0,
        norm_const: float = 1.0,
        reg: RegularizerConfig | None = None,
        is_cap: float | None = None,
    ) -> tuple[dict[str, float], torch.Tensor]:
        """One optimizer step over the whole batch whose old log-probs are the update's
        own, detached (the weights have not changed since sampling); returns the
        metrics and those log-probs (b, t), 0 off the response, as ``logprobs`` would."""
        check_policy_batch(batch, reg or RegularizerConfig())
        record: list[torch.Tensor] = []
        loss_fn = self._policy_loss(loss_cfg, reg, is_cap, record)
        start = time.perf_counter()
        out, logp_bt = self._step(batch, loss_fn, norm_const, "actor", temperature, record)
        out["timing/update_s"] = time.perf_counter() - start
        return out, logp_bt * batch.response_mask_bt

    def has_dropout(self) -> bool:
        """Whether a training-mode forward is random: never, the engine builds the
        model without dropout."""
        return self.m.tconfig.hidden_dropout > 0 or self.m.tconfig.attention_dropout > 0

    @cpu_shim.runs_on_cpu
    def update_sft(self, batch: TrajectoryBatch) -> dict[str, float]:
        """One supervised step: token-mean NLL of the response tokens."""

        def loss_fn(mb, logp, entropy, norm):
            return sft_loss(logp, mb.response_mask_bt.float(), norm)

        return self._step(batch, loss_fn, 1.0, "sft")[0]

    # -- weights ------------------------------------------------------------------------
    def gathered_state(self, value=lambda p: p.detach()) -> dict[str, torch.Tensor] | None:
        """``MegatronModel.gathered_state``: full Megatron tensors on rank 0. Collective."""
        return self.m.gathered_state(value)

    @cpu_shim.runs_on_cpu
    def named_weights(self, merged: bool = True) -> list[tuple[str, torch.Tensor]] | None:
        """Full weights on rank 0 (None elsewhere), under the model's checkpoint names
        (``rlpost.trainers.hf_format``), the tied copy ``lm_head.weight`` included as the
        FSDP engine sends it (a tied head module in vLLM is refreshed only by its
        own name). Collective: call on every rank."""
        state = self.m.gathered_state()
        if state is None:
            return None
        hf = megatron_to_hf(state, self.shape)
        if self.shape.tied:
            hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
        return list(hf.items())

    def adapter_weights(self) -> None:
        raise ValueError("adapter_weights(): the Megatron engine has no LoRA")

    def save_hf(self, out_dir: str, tokenizer_dir: str | None = None) -> str | None:
        """Write the policy as an HF model directory (atomically, rank 0). Collective."""
        weights = self.named_weights()
        if self.rank != 0:
            return None
        from rlpost.trainers.hf_format import CheckpointLayout
        from transformers import AutoModelForCausalLM, AutoTokenizer

        assert weights is not None
        model = AutoModelForCausalLM.from_config(self.m.hf_config, dtype=torch.float32)
        # checkpoint names -> the model's own parameters (e.g. MoE experts fused in one tensor)
        layout = CheckpointLayout(model)
        missing = layout.unwritten(layout.load(weights))
        if missing:
            raise RuntimeError(f"save_hf: no weights for {missing[:5]}")
        with atomic_directory(out_dir) as tmp:
            model.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(tokenizer_dir or self.cfg.model_path).save_pretrained(tmp)
        return str(out_dir)

    # -- checkpoints ----------------------------------------------------------------------
    @cpu_shim.runs_on_cpu
    def save_checkpoint(self, path: str) -> str:
        """``rlpost.trainers.megatron.checkpoint.save``. Collective."""
        return checkpoint.save(self.m, path)

    @cpu_shim.runs_on_cpu
    def load_checkpoint(self, path: str) -> None:
        """``rlpost.trainers.megatron.checkpoint.load`` into this freshly built engine. Collective."""
        checkpoint.load(self.m, path)

    def close(self) -> None:
        self.m.close()
