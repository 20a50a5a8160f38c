"""Megatron-core policy engine: log-probs, policy/SFT updates, HF-named weight export,
with tensor (``tp``), pipeline (``pp``) and expert (``ep``) parallelism and data
parallelism over the remaining ranks.

Legend: b = samples, t = tokens, v = vocab.

The engine is a ``rlpost.trainers.engine.PolicyEngine`` as ``FSDPEngine`` is, so
the worker shells and the controller drive either one alike; log-probs, updates
and checkpoints are ``rlpost.trainers.policy``'s. What differs inside:

- **Data.** The worker group hands every rank an equal share of the batch, as
  for FSDP. The ranks of one model-parallel group (tp x pp ranks that hold one
  copy of the model between them) must all see the same samples, so each
  engine call first gathers its group's shares into one data-parallel batch,
  and each rank returns the rows it was given (``schedule.dp_batch``).
- **Model and steps** are ``model.MegatronModel``'s (the backend): megatron-core's
  ``GPTModel`` converted from the HF checkpoint, every forward and backward
  through megatron's schedule.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from rlpost.algos import entropy_from_logits
from rlpost.runtime import device as devices
from rlpost.trainers.batch import TrajectoryBatch
from rlpost.trainers.distributed import Empty, new_tensor
from rlpost.trainers.files import atomic_directory
from rlpost.trainers.logprobs import token_logprobs
from rlpost.trainers.megatron import cpu_shim
from rlpost.trainers.megatron.checkpoint import MegatronState
from rlpost.trainers.megatron.config import (  # noqa: F401  (the engine's public names)
    MegatronEngineConfig,
    MegatronParallel,
    check_divisible,
)
from rlpost.trainers.megatron.convert import (
    EMBEDDING,
    hf_to_megatron,
    megatron_to_hf,
    part_to_hf,
    parts,
)
from rlpost.trainers.megatron.model import MegatronModel
from rlpost.trainers.megatron.schedule import dp_batch, from_last_stage
from rlpost.trainers.micro_batching import pack, row_lengths, unpack
from rlpost.trainers.policy import PolicyUpdates


class MegatronEngine(PolicyUpdates):
    @cpu_shim.runs_on_cpu
    def __init__(self, cfg: MegatronEngineConfig, rank: int, world_size: int, init_method: str):
        self.m = MegatronModel(cfg, rank, world_size, init_method)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = self.m.device
        self.shape, self.num_params = self.m.shape, self.m.num_params
        self._specs: list[tuple[str, tuple[int, ...], torch.dtype]] | None = None
        super().__init__(self.m, self._token_stats, MegatronState(self.m))

    # -- forward passes -----------------------------------------------------------------
    def _token_stats(
        self, mb: TrajectoryBatch, logits: torch.Tensor, temperature: float, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (b, t) and, if asked, entropies (b, t) from the model's logits."""
        logits = logits.float() / temperature
        logp = self._rows(mb, token_logprobs(logits, self._ids(mb, logits.device)))
        if not with_entropy:
            return logp, None
        return logp, self._rows(mb, F.pad(entropy_from_logits(logits[:, :-1]), (1, 0)))

    def _ids(self, mb: TrajectoryBatch, device: torch.device) -> torch.Tensor:
        """The token ids laid out as the model ran them (packed: one row), on ``device``."""
        return devices.upload(pack(mb)[0] if self.cfg.packing else mb.input_ids_bt, device)

    def _rows(self, mb: TrajectoryBatch, values: torch.Tensor) -> torch.Tensor:
        """Per-token ``values`` of the model's layout as ``mb``'s rows (b, t)."""
        if not self.cfg.packing:
            return values
        return unpack(values, row_lengths(mb), mb.input_ids_bt.shape[1])

    @cpu_shim.runs_on_cpu
    @torch.no_grad()
    def greedy_match(self, batch: TrajectoryBatch) -> torch.Tensor:
        """(b,) bool: every response token is the argmax given the tokens before it."""
        m = self.m
        m.eval()
        data, mine = dp_batch(batch, m.mpu)
        mbs = m.micro_batches(data, self.cfg.micro_batch_size)

        def hits(mb, logits):
            ids = self._ids(mb, logits.device)
            # 1 where a token is the argmax given the tokens before it
            hit = self._rows(mb, F.pad((logits[:, :-1].argmax(-1) == ids[:, 1:]).float(), (1, 0)))
            resp_bt = devices.upload(mb.response_mask_bt, logits.device).bool()
            return torch.zeros(()), ((hit > 0) | ~resp_bt).all(dim=1)

        results = m.run(mbs, hits)
        out = torch.cat(results).float().cpu() if m.last_stage else torch.zeros(len(data))
        return from_last_stage(out, m.mpu, self.cfg.parallel.pp)[mine].bool()

    def has_dropout(self) -> bool:
        """Whether a training-mode forward is random: never, the engine builds the
        model without dropout."""
        return self.m.tconfig.hidden_dropout > 0 or self.m.tconfig.attention_dropout > 0

    # -- weights ------------------------------------------------------------------------
    def gathered_state(self, value=lambda p: p.detach()) -> dict[str, torch.Tensor] | None:
        """``MegatronModel.gathered_state``: full Megatron tensors on rank 0. Collective."""
        return self.m.gathered_state(value)

    @cpu_shim.runs_on_cpu
    def named_weights(self, merged: bool = True) -> list[tuple[str, torch.Tensor]] | None:
        """Full weights on rank 0 (None elsewhere), under the model's checkpoint names
        (``rlpost.runtime.hf_format``), the tied copy ``lm_head.weight`` included as the
        FSDP engine sends it (a tied head module in vLLM is refreshed only by its
        own name). Collective: call on every rank."""
        state = self.m.gathered_state()
        if state is None:
            return None
        hf = megatron_to_hf(state, self.shape)
        if self.shape.tied:
            hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
        return list(hf.items())

    def weight_stream(
        self, empty: Empty = new_tensor
    ) -> tuple[list[tuple[str, tuple[int, ...], torch.dtype]], Iterator[tuple[str, torch.Tensor]]]:
        """``named_weights`` a part at a time (the embedding, each decoder layer, the
        head: ``MegatronModel.gathered_parts``): the names, shapes and dtypes of every
        tensor, and an iterator that gathers one part, converts it and hands out its
        tensors in that order, so rank 0 holds one part beyond its shards instead of
        the whole model (``rollout.weight_sync=collective``). Collective: every rank
        runs the iterator to its end; the tensors reach rank 0 only.
        ``empty(shape, dtype, device)``: the memory each full tensor is put in (the
        ``ipc`` sync's shared-memory buckets on the CPU)."""
        if self._specs is None:
            self._specs = self._stream_specs()
        return self._specs, self._streamed(self._specs, empty)

    def _stream_specs(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """The checkpoint tensors ``named_weights`` gives, in stream order: the HF model
        built on the meta device (nothing allocated), converted to Megatron's tensors
        and back one part at a time."""
        from transformers import AutoModelForCausalLM

        from rlpost.runtime.hf_format import to_checkpoint_format

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.m.hf_config)
        mg = hf_to_megatron(to_checkpoint_format(model, model.state_dict()), self.shape)
        dtype = next(iter(self.m.local_params().values())).dtype
        return [
            (n, tuple(t.shape), dtype)
            for part in parts(self.shape)
            for n, t in self._part_hf(part, mg).items()
        ]

    def _part_hf(self, part: int | str, mg: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        hf = part_to_hf(part, mg, self.shape)
        if part == EMBEDDING and self.shape.tied:  # the copy vLLM's tied head is loaded by
            hf["lm_head.weight"] = hf["model.embed_tokens.weight"]
        return hf

    def _streamed(
        self, specs: list[tuple[str, tuple[int, ...], torch.dtype]], empty: Empty
    ) -> Iterator:
        start = 0
        for part, state in self.m.gathered_parts(empty):
            if state is None:
                continue
            hf = self._part_hf(part, state)
            names = [n for n, _, _ in specs[start : start + len(hf)]]
            if names != list(hf):
                raise RuntimeError(
                    f"the weight stream's part {part!r} converted to {list(hf)}, not the "
                    f"names announced, {names}: use rollout.weight_sync=object_store"
                )
            start += len(hf)
            yield from hf.items()
            del state, hf  # before the next part's gathers
            devices.trim_host_heap(self.m.device.type)  # the part's tensors are freed

    def adapter_weights(self) -> None:
        raise ValueError("adapter_weights(): the Megatron engine has no LoRA")

    def save_hf(self, out_dir: str, tokenizer_dir: str | None = None) -> str | None:
        """Write the policy as an HF model directory (atomically, rank 0). Collective."""
        weights = self.named_weights()
        if self.rank != 0:
            return None
        from transformers import AutoTokenizer

        from rlpost.runtime.hf_format import model_from_checkpoint_weights

        assert weights is not None
        model = model_from_checkpoint_weights(self.m.hf_config, weights)
        with atomic_directory(out_dir) as tmp:
            model.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(tokenizer_dir or self.cfg.model_path).save_pretrained(tmp)
        return str(out_dir)

    def close(self) -> None:
        self.m.close()
