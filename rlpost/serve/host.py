"""One base model and its tenants: each a LoRA adapter with its own optimizer.

Every operation runs on the host's one worker thread (``rlpost.serve.app``), one
at a time in the order the requests arrived, so a tenant's ``optim_step`` sees the
gradients of every ``forward_backward`` it sent before it. Tenants share the base
weights and nothing else: an operation activates its tenant's adapter, whose
parameters are the only ones with gradients, so two tenants' gradients never mix
and a tenant trained beside others ends where it would have alone.

Sampling uses snapshots of an adapter (``save_weights_for_sampler``): each is
loaded into an adapter slot of its own (a few at once, the least recently used
evicted), so training can go on while samplers read the weights they were given.
Sample requests waiting for the worker are answered together: one batched
generation per snapshot (``sample_queued``).

Legend: b = sequences, t = tokens, v = vocabulary, n = tokens of one datum,
k = targets per position.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import secrets
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from rlpost.serve import losses
from rlpost.serve.errors import NotFound, UserError
from rlpost.serve.sampling import SampleRequest, batches, draw, pass_on
from rlpost.serve.tenant_log import TenantLog
from rlpost.serve.wire import DatumIn, ForwardBackwardIn, SampledOut, SampleParams
from rlpost.trainers.files import atomic_directory

if TYPE_CHECKING:
    from peft import PeftModel

    from rlpost.serve.vllm_sampler import VLLMSampler

log = logging.getLogger(__name__)

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
UNEMBED = ("lm_head",)
LORA_ALPHA = 32  # the update is (32 / rank) B A, whatever the rank
MICRO_TOKENS = 16384  # padded tokens per forward pass of a forward_backward
SAMPLER_SLOTS = 4  # sampler snapshots loaded as adapters at once
SAMPLE_ROWS = 256  # sequences generated together, at most, by the model sampler
SNAPSHOTS_KEPT = 8  # unnamed sampler snapshots kept per tenant (the newest)
PLACEHOLDER = "{adapter}"


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True
    seed: int | None = None

    def targets(self) -> list[str]:
        names = (ATTN if self.train_attn else ()) + (MLP if self.train_mlp else ())
        return list(names + (UNEMBED if self.train_unembed else ()))

    def peft_config(self):
        from peft import LoraConfig

        if self.rank < 1:
            raise UserError(f"lora rank {self.rank}: a positive rank is required")
        if not self.targets():
            raise UserError("train_mlp, train_attn and train_unembed are all false: nothing trains")
        return LoraConfig(r=self.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                          target_modules=self.targets(), task_type="CAUSAL_LM")  # fmt: skip

    def adapter_config(self) -> dict:
        """``adapter_config.json``'s content, as PEFT writes it (JSON-safe)."""
        config = self.peft_config().to_dict()
        return {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}


@dataclass
class Tenant:
    model_id: str
    adapter: str  # its adapter's name in the model
    spec: LoraSpec
    owner: str  # the API key's digest: who may read its checkpoints
    optimizer: torch.optim.Optimizer | None = None
    steps: int = 0
    snapshots: list[str] = field(default_factory=list)  # unnamed sampler snapshots, oldest first
    log: TenantLog | None = None  # its training as a run folder for the board
    metadata: dict[str, str] = field(default_factory=dict)  # the client's user_metadata


@dataclass
class Snapshot:
    """Adapter weights frozen for sampling, under names with ``{adapter}`` for the
    adapter's own; None: the base model."""

    spec: LoraSpec | None
    tensors: dict[str, torch.Tensor] | None


class ModelHost:
    """The base model ``path``, served as ``name``, and the tenants trained on it."""

    def __init__(
        self, name: str, path: str, state_dir: Path, device: str = "cpu", sampler: str = "model"
    ):
        """``sampler``: ``model`` samples with this model and its adapters, ``vllm``
        with a vLLM engine that loads the sampler snapshots as LoRA adapters
        (``rlpost.serve.vllm_sampler``)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.name, self.path, self.state_dir = name, path, state_dir
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        torch.nn.Module.to(self.model, self.device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.config = self.model.config
        self.vocab = int(self.model.get_output_embeddings().weight.shape[0])
        self.max_len = int(getattr(self.config, "max_position_embeddings", 2048))
        self.arch = str(getattr(self.config, "model_type", "unknown"))
        self.peft: PeftModel | None = None  # the PEFT wrapper, made with the first adapter
        self.tenants: dict[str, Tenant] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self._slots: OrderedDict[str, str] = OrderedDict()  # snapshot key -> adapter name
        self._adapters = 0
        self.full_finetune: str | None = None
        self.vllm: VLLMSampler | None = None
        if sampler == "vllm":
            from rlpost.serve.vllm_sampler import VLLMSampler

            self.vllm = VLLMSampler(
                path, self.max_len, device, state_dir / "sampler", SAMPLER_SLOTS
            )
        elif sampler != "model":
            raise ValueError(f"sampler={sampler!r}: model or vllm")

    # -- tenants -------------------------------------------------------------
    def create(
        self, model_id: str, spec: LoraSpec, owner: str, metadata: dict[str, str] | None = None
    ) -> Tenant:
        if model_id in self.tenants:
            raise UserError(f"model {model_id} exists")
        spec = (
            spec
            if spec.seed is not None
            else LoraSpec(**{**asdict(spec), "seed": secrets.randbits(31)})
        )
        adapter = self._add_adapter(spec)
        metadata = dict(metadata or {})
        description = {"model_id": model_id, "base_model": self.name, "lora": asdict(spec),
                       "user_metadata": metadata}  # fmt: skip
        folder = self.state_dir / "runs" / model_id.replace(":", "_")
        tenant = Tenant(model_id, adapter, spec, owner, log=TenantLog.start(folder, description),
                        metadata=metadata)  # fmt: skip
        self.tenants[model_id] = tenant
        log.info("tenant %s: LoRA rank %d on %s (%s)", model_id, spec.rank, self.name,
                 ", ".join(spec.targets()))  # fmt: skip
        return tenant

    def tenant(self, model_id: str) -> Tenant:
        if model_id not in self.tenants:
            raise NotFound(f"no model {model_id!r} on this server")
        return self.tenants[model_id]

    def _add_adapter(self, spec: LoraSpec) -> str:
        from peft import get_peft_model

        self._adapters += 1
        name = f"a{self._adapters}"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(spec.seed or 0))
            if self.peft is None:
                self.peft = get_peft_model(self.model, spec.peft_config(), adapter_name=name)
            else:
                self.peft.add_adapter(name, spec.peft_config())
        torch.nn.Module.to(self.peft, self.device)
        return name

    def _params(self, adapter: str) -> list[tuple[str, torch.nn.Parameter]]:
        assert self.peft is not None
        mark = f".{adapter}."
        return [(n, p) for n, p in self.peft.named_parameters() if mark in n]

    @contextmanager
    def _active(self, adapter: str | None) -> Iterator[torch.nn.Module]:
        """The model with ``adapter`` alone active (None: the base model)."""
        if adapter is None:
            if self.peft is None:
                yield self.model
                return
            with self.peft.disable_adapter():
                yield self.peft
            return
        assert self.peft is not None
        self.peft.set_adapter(adapter)
        for _, p in self._params(adapter):
            p.requires_grad_(True)
        yield self.peft

    # -- training ------------------------------------------------------------
    def forward_backward(
        self, request: ForwardBackwardIn
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        """Each datum's target log-probs; unless ``forward_only``, the gradient of the
        summed loss is added to the tenant's."""
        tenant = self.tenant(request.model_id)
        fn = losses.loss_fn(request.loss_fn)
        if not request.data:
            raise UserError("forward_backward without data")
        for i, d in enumerate(request.data):
            self._check_datum(d, i)
        outputs: list[np.ndarray] = [np.zeros(0)] * len(request.data)
        total = 0.0
        with self._active(tenant.adapter) as model:
            for batch in _micro_batches([len(d.tokens) for d in request.data], MICRO_TOKENS):
                loss, lps = self._datum_losses(model, [request.data[i] for i in batch], fn,
                                               request.config)  # fmt: skip
                if not request.forward_only:
                    loss.backward()
                total += float(loss.detach())
                for i, lp in zip(batch, lps, strict=True):
                    outputs[i] = lp.detach().float().cpu().numpy()
        if not request.forward_only and tenant.log is not None:
            tokens = sum(_weighted_targets(d) for d in request.data)
            tenant.log.forward_backward(total, tokens, len(request.data))
        return outputs, {"loss:sum": total}

    def _check_datum(self, d: DatumIn, i: int) -> None:
        if "target_tokens" not in d.inputs:
            raise UserError(f"data[{i}].loss_fn_inputs lacks target_tokens")
        targets = d.inputs["target_tokens"]
        if not d.tokens or targets.shape[0] != len(d.tokens):
            raise UserError(f"data[{i}]: {len(d.tokens)} input tokens and {targets.shape[0]} "
                            "target positions; they must match (position i predicts target i)")  # fmt: skip
        if len(d.tokens) > self.max_len:
            raise UserError(f"data[{i}]: {len(d.tokens)} tokens; {self.name} takes {self.max_len}")
        for what, ids in (("model_input", np.asarray(d.tokens)), ("target_tokens", targets)):
            if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
                raise UserError(f"data[{i}].{what}: token ids must lie in [0, {self.vocab})")

    def _datum_losses(
        self, model: torch.nn.Module, data: Sequence[DatumIn], fn: losses.LossFn, config: dict
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        longest = max(len(d.tokens) for d in data)
        ids_bt = torch.zeros(len(data), longest, dtype=torch.long)
        mask_bt = torch.zeros(len(data), longest, dtype=torch.long)
        for j, d in enumerate(data):
            ids_bt[j, : len(d.tokens)] = torch.tensor(d.tokens)
            mask_bt[j, : len(d.tokens)] = 1
        logits_btv = model(input_ids=ids_bt.to(self.device),
                           attention_mask=mask_bt.to(self.device)).logits  # fmt: skip
        loss = torch.zeros((), device=self.device)
        lps = []
        for j, d in enumerate(data):
            n = len(d.tokens)
            targets = torch.as_tensor(
                d.inputs["target_tokens"], dtype=torch.long, device=self.device
            )
            logp_nv = torch.log_softmax(logits_btv[j, :n].float(), dim=-1)
            lp = logp_nv.gather(-1, targets.view(n, -1)).view(targets.shape)
            inputs = {k: torch.as_tensor(v, device=self.device) for k, v in d.inputs.items()}
            loss = loss + fn(lp, inputs, config).sum()
            lps.append(lp)
        return loss, lps

    def optim_step(self, model_id: str, adam: dict) -> dict[str, float]:
        """One AdamW step (decoupled weight decay, as ``torch.optim.AdamW``) of the
        tenant's adapter on the gradients gathered since its last step."""
        tenant = self.tenant(model_id)
        params = [p for _, p in self._params(tenant.adapter)]
        lr = float(adam.get("learning_rate", 1e-4))
        betas = (float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95)))
        eps, decay = float(adam.get("eps", 1e-12)), float(adam.get("weight_decay", 0.0))
        clip = float(adam.get("grad_clip_norm", 0.0))
        if not lr >= 0 or not 0 <= betas[0] < 1 or not 0 <= betas[1] < 1 or not eps > 0:
            raise UserError(f"adam_params {adam}: learning_rate >= 0, beta1 and beta2 in [0, 1) "
                            "and eps > 0 are required")  # fmt: skip
        if tenant.optimizer is None:
            tenant.optimizer = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps,
                                                 weight_decay=decay)  # fmt: skip
        for group in tenant.optimizer.param_groups:
            group.update(lr=lr, betas=betas, eps=eps, weight_decay=decay)
        # the gradient's norm, clipped to grad_clip_norm when it is set (0: not clipped)
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else math.inf))
        tenant.optimizer.step()
        tenant.optimizer.zero_grad(set_to_none=True)
        tenant.steps += 1
        if tenant.log is not None:
            tenant.log.optim_step(tenant.steps, norm, lr)
        return {"grad_norm": norm, "learning_rate": lr}

    # -- weights -------------------------------------------------------------
    def _adapter_tensors(self, tenant: Tenant) -> dict[str, torch.Tensor]:
        mark = f".{tenant.adapter}."
        return {n.replace(mark, f".{PLACEHOLDER}."): p.detach().cpu().clone()
                for n, p in self._params(tenant.adapter)}  # fmt: skip

    def _set_adapter_tensors(self, adapter: str, tensors: dict[str, torch.Tensor]) -> None:
        params = dict(self._params(adapter))
        mark = f".{PLACEHOLDER}."
        for name, value in tensors.items():
            target = params.get(name.replace(mark, f".{adapter}."))
            if target is None or target.shape != value.shape:
                raise UserError(f"the checkpoint's {name} does not fit this model's adapter")
            with torch.no_grad():
                target.copy_(value.to(target.device))

    def save(self, tenant: Tenant, where: Path, optimizer: bool) -> None:
        """The tenant's adapter (and optimizer state) in ``where``, written whole or
        not at all (a folder beside it, then a rename)."""
        from safetensors.torch import save_file

        with atomic_directory(where) as tmp:
            save_file(self._adapter_tensors(tenant), str(tmp / "adapter.safetensors"))
            if optimizer and tenant.optimizer is not None:
                torch.save(tenant.optimizer.state_dict(), tmp / "optimizer.pt")
            meta = {"base_model": self.name, "lora": asdict(tenant.spec), "owner": tenant.owner,
                    "steps": tenant.steps, "model_id": tenant.model_id,
                    "user_metadata": tenant.metadata}  # fmt: skip
            (tmp / "meta.json").write_text(json.dumps(meta))

    def load(self, model_id: str, where: Path, optimizer: bool, owner: str) -> Tenant:
        """A new tenant from a checkpoint ``save`` wrote (with its optimizer state)."""
        from safetensors.torch import load_file

        meta = read_meta(where)
        if meta["base_model"] != self.name:
            raise UserError(f"the checkpoint is of {meta['base_model']}, not {self.name}")
        tenant = self.create(model_id, LoraSpec(**meta["lora"]), owner)
        self._set_adapter_tensors(tenant.adapter, load_file(str(where / "adapter.safetensors")))
        tenant.steps = int(meta.get("steps", 0))
        if optimizer:
            if not (where / "optimizer.pt").exists():
                raise UserError("the checkpoint holds no optimizer state (it was saved before "
                                "the first optim_step); load it without the optimizer")  # fmt: skip
            params = [p for _, p in self._params(tenant.adapter)]
            tenant.optimizer = torch.optim.AdamW(params)
            tenant.optimizer.load_state_dict(torch.load(where / "optimizer.pt", weights_only=True))
        return tenant

    def snapshot(self, tenant: Tenant, key: str, named: bool) -> None:
        """Freeze the tenant's adapter for sampling under ``key``; the newest
        ``SNAPSHOTS_KEPT`` unnamed ones are kept."""
        self.snapshots[key] = Snapshot(tenant.spec, self._adapter_tensors(tenant))
        if named:
            return
        tenant.snapshots.append(key)
        while len(tenant.snapshots) > SNAPSHOTS_KEPT:
            self._drop_snapshot(tenant.snapshots.pop(0))

    def base_snapshot(self, key: str) -> None:
        self.snapshots[key] = Snapshot(None, None)

    def load_snapshot(self, key: str, where: Path) -> None:
        from safetensors.torch import load_file

        meta = read_meta(where)
        spec = LoraSpec(**meta["lora"])
        self.snapshots[key] = Snapshot(spec, load_file(str(where / "adapter.safetensors")))

    def _drop_snapshot(self, key: str) -> None:
        self.snapshots.pop(key, None)
        if self.vllm is not None:
            self.vllm.drop(key)
        adapter = self._slots.pop(key, None)
        if adapter is not None and self.peft is not None:
            self.peft.delete_adapter(adapter)

    def _snapshot(self, key: str) -> Snapshot:
        if key not in self.snapshots:
            raise NotFound(f"sampling session {key!r}: its weights are no longer held (a "
                           f"server keeps the last {SNAPSHOTS_KEPT} unnamed snapshots of a model; "
                           "save_weights_for_sampler(name) keeps one)")  # fmt: skip
        return self.snapshots[key]

    def _slot(self, key: str) -> str | None:
        """The adapter holding snapshot ``key`` (loaded now if it is not); None: the base."""
        snap = self._snapshot(key)
        if snap.spec is None or snap.tensors is None:
            return None
        if key in self._slots:
            self._slots.move_to_end(key)
            return self._slots[key]
        while len(self._slots) >= SAMPLER_SLOTS:
            _, evicted = self._slots.popitem(last=False)
            assert self.peft is not None
            self.peft.delete_adapter(evicted)
        adapter = self._add_adapter(snap.spec)
        self._set_adapter_tensors(adapter, snap.tensors)
        self._slots[key] = adapter
        return adapter

    # -- sampling ------------------------------------------------------------
    def _max_tokens(self, prompt: list[int], params: SampleParams) -> int:
        """The tokens ``prompt`` leaves room for, at most ``params.max_tokens``."""
        if not prompt:
            raise UserError("the prompt is empty")
        if max(prompt) >= self.vocab or min(prompt) < 0:
            raise UserError(f"prompt token ids must lie in [0, {self.vocab})")
        room = self.max_len - len(prompt)
        if room < 1:
            raise UserError(
                f"the prompt has {len(prompt)} tokens; {self.name} takes {self.max_len}"
            )
        return min(params.max_tokens, room)

    def sample_later(
        self, key: str, prompt: list[int], n: int, params: SampleParams, prompt_logprobs: bool
    ) -> Future[tuple[list[SampledOut], list[float] | None]] | None:
        """The vLLM engine's answer to come, where it samples snapshot ``key`` (it
        batches the requests of every tenant); None: the model answers (``sample_queued``)."""
        snap = self._snapshot(key)
        # vLLM 0.32 loads no LoRA on lm_head: an adapter that trains the unembedding
        # is sampled by the model itself
        if self.vllm is None or (snap.spec is not None and snap.spec.train_unembed):
            return None
        steps = self._max_tokens(prompt, params)
        lora = None
        if snap.spec is not None and snap.tensors is not None:
            mark = f".{PLACEHOLDER}"
            tensors = {name.replace(mark, ""): t for name, t in snap.tensors.items()}
            lora = self.vllm.adapter(key, tensors, snap.spec.rank, snap.spec.adapter_config())
        return self.vllm.submit(prompt, n, params, steps, prompt_logprobs, lora)

    def sample_queued(self, queue: deque[SampleRequest]) -> None:
        """Answer every request in ``queue`` (the worker runs this for the first of
        them; later ones find theirs answered). The vLLM engine answers those it
        samples; the model the rest, in one batched generation per snapshot, so
        requests sent together -- a recipe sends each episode's on its own --
        share their forward passes. A request's error is its own answer."""
        by_key: dict[str, list[SampleRequest]] = {}
        while queue:
            r = queue.popleft()
            try:
                pending = self.sample_later(r.key, r.prompt, r.n, r.params, r.prompt_logprobs)
                if pending is None:
                    self._max_tokens(r.prompt, r.params)
            except Exception as e:  # noqa: BLE001 (answered to its request, not raised here)
                r.answer.set_exception(e)
                continue
            if pending is not None:
                pending.add_done_callback(partial(pass_on, r.answer))
            else:
                by_key.setdefault(r.key, []).append(r)
        for key, requests in by_key.items():
            for batch in batches(requests, SAMPLE_ROWS):
                try:
                    answers = self._generate(key, batch)
                except Exception as e:  # noqa: BLE001 (each request of the batch answered)
                    for r in batch:
                        r.answer.set_exception(e)
                    continue
                for r, answer in zip(batch, answers, strict=True):
                    r.answer.set_result(answer)

    @torch.no_grad()
    def _generate(
        self, key: str, requests: list[SampleRequest]
    ) -> list[tuple[list[SampledOut], list[float] | None]]:
        """Each request's ``n`` continuations by the snapshot ``key``, all rows in one
        batch: prompts left-padded, positions counted from each prompt's first token.
        Each token's log-prob is under softmax(logits / temperature), before top-k and
        top-p; each request draws from its own generator (its seed), as it would alone."""
        adapter = self._slot(key)
        spans = list(itertools.accumulate((r.n for r in requests), initial=0))
        owner = [i for i, r in enumerate(requests) for _ in range(r.n)]  # row -> request
        limit = [self._max_tokens(requests[i].prompt, requests[i].params) for i in owner]
        width = max(len(r.prompt) for r in requests)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(owner), width), pad, dtype=torch.long)
        mask = torch.zeros((len(owner), width), dtype=torch.long)
        for row, i in enumerate(owner):
            prompt = requests[i].prompt
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        temperature = torch.tensor(
            [max(requests[i].params.temperature, 1e-6) for i in owner], device=self.device
        )[:, None]
        generators = []
        for r in requests:
            generators.append(torch.Generator(device="cpu"))
            generators[-1].manual_seed(
                r.params.seed if r.params.seed is not None else secrets.randbits(62)
            )
        eos = self.tokenizer.eos_token_id
        stops = [
            set(r.params.stop_tokens) | ({eos} if eos is not None else set()) for r in requests
        ]
        rows = len(owner)
        tokens: list[list[int]] = [[] for _ in range(rows)]
        lps: list[list[float]] = [[] for _ in range(rows)]
        done, stopped = [False] * rows, [False] * rows
        with self._active(adapter) as model:
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
            past, last = out.past_key_values, out.logits[:, -1]
            firsts: list[list[float] | None] = [None] * len(requests)
            for i, r in enumerate(requests):
                if r.prompt_logprobs:
                    row, start = spans[i], width - len(r.prompt)
                    lp = torch.log_softmax(out.logits[row, start:-1].float(), -1)
                    picked = lp.gather(-1, ids[row, start + 1 :, None]).view(-1)
                    firsts[i] = [math.nan, *picked.tolist()]
            for _ in range(max(limit)):
                logp = torch.log_softmax(last.float() / temperature, -1)
                choice = torch.cat([
                    draw(logp[spans[i] : spans[i + 1]], r.params, generators[i])
                    for i, r in enumerate(requests)
                ])  # fmt: skip
                chosen = logp.gather(-1, choice[:, None]).view(-1)
                for row, i in enumerate(owner):
                    if done[row]:
                        continue
                    token = int(choice[row])
                    tokens[row].append(token)
                    lps[row].append(float(chosen[row]))
                    if token in stops[i] or self._stop_string(
                        tokens[row], requests[i].params.stop_strings
                    ):
                        done[row] = stopped[row] = True
                    elif len(tokens[row]) >= limit[row]:
                        done[row] = True
                if all(done):
                    break
                mask = torch.cat([mask, mask.new_ones((rows, 1))], -1)
                positions = positions[:, -1:] + 1
                out = model(input_ids=choice[:, None], attention_mask=mask,
                            position_ids=positions, past_key_values=past, use_cache=True)  # fmt: skip
                past, last = out.past_key_values, out.logits[:, -1]
        return [
            ([SampledOut(tokens[row], lps[row], stopped[row])
              for row in range(spans[i], spans[i + 1])], firsts[i])
            for i in range(len(requests))
        ]  # fmt: skip

    def _stop_string(self, tokens: list[int], stops: tuple[str, ...]) -> bool:
        if not stops:
            return False
        tail = self.tokenizer.decode(tokens[-32:], skip_special_tokens=False)
        return any(s in tail for s in stops)


def _weighted_targets(d: DatumIn) -> float:
    """The datum's target positions that count: a nonzero weight where it has
    weights, else every one."""
    if "weights" in d.inputs:
        return float(np.count_nonzero(d.inputs["weights"]))
    return float(d.inputs["target_tokens"].shape[0])


def _micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Datum indices in runs whose padded size (count x longest) stays in ``budget``."""
    batches: list[list[int]] = []
    for i, n in enumerate(lengths):
        if batches:
            run = batches[-1]
            longest = max(max(lengths[j] for j in run), n)
            if longest * (len(run) + 1) <= budget:
                run.append(i)
                continue
        batches.append([i])
    return batches


def read_meta(where: Path) -> dict:
    try:
        return json.loads((where / "meta.json").read_text())
    except FileNotFoundError:
        raise NotFound(f"no checkpoint at {where.name}") from None
