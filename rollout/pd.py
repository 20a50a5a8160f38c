"""Prefill/decode (PD) disaggregation: what runs where, and how a request is split.

A PD rollout has two pools of replicas. A *prefill* replica (KV producer)
computes the prompt's KV cache and hands it to a KV connector; a *decode*
replica (KV consumer) finds that KV in the connector, computes only the
prompt's last few tokens itself, and samples the whole completion. Each
request therefore makes two calls, in order:

1. ``prefill_request(req)`` on a prefill replica: the same prompt token ids,
   ``max_tokens=1``, greedy, ``n=1`` (as vLLM's disaggregated-serving examples
   do); its output is thrown away, its side effect is the stored KV;
2. the unchanged request on a decode replica, which returns the completion
   and the sampling log-probs.

The connectors key the transferred KV by the prompt's token ids, so the two
calls must carry exactly the same ``prompt_ids``. With
``ExampleConnector`` (the one that runs on a CPU) the KV goes through files in
a shared directory, named by a hash of the prompt's tokens and nothing else:
KV written before a weight update would be found and reused after it, so the
directory is emptied whenever weights change (``clear_kv_store``).

``PDRouter`` is plain Python; the Ray side is in ``rlpost/serving/rollout_group.py``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from rlpost.rollout.base import GenerationRequest, SamplingConfig
from rlpost.rollout.router import Router

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig

    from rlpost.rollout.vllm.config import VLLMEngineConfig

# Connectors that store KV as files under kv_connector_extra_config["shared_storage_path"].
FILE_CONNECTORS = ("ExampleConnector",)


@dataclass(frozen=True)
class KVTransferSpec:
    """One replica's side of the KV connector (vLLM's ``KVTransferConfig``).

    ``connector``: a vLLM connector class name: ``ExampleConnector`` (files in
    ``shared_dir``; CPU or GPU, slow, for tests), ``NixlConnector`` or
    ``MooncakeConnector`` (RDMA/NVLink between GPUs), ... ``extra`` goes to
    ``kv_connector_extra_config`` as it is.
    """

    connector: str
    role: Literal["kv_producer", "kv_consumer", "kv_both"]
    shared_dir: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def vllm_config(self) -> KVTransferConfig:
        """The ``vllm.config.KVTransferConfig`` for this side."""
        from vllm.config import KVTransferConfig

        extra = dict(self.extra)
        if self.connector in FILE_CONNECTORS:
            if not self.shared_dir:
                raise ValueError(f"{self.connector} needs a shared_dir for its KV files")
            extra["shared_storage_path"] = self.shared_dir
        return KVTransferConfig(
            kv_connector=self.connector, kv_role=self.role, kv_connector_extra_config=extra
        )


@dataclass(frozen=True)
class PDEngineConfig:
    """Engine configs of both pools: ``prefill`` and ``decode`` are vLLM engine
    configs that differ in their ``kv_transfer``."""

    prefill: VLLMEngineConfig
    decode: VLLMEngineConfig
    prefill_replicas: int = 1
    decode_replicas: int = 1

    @property
    def replicas(self) -> int:
        return self.prefill_replicas + self.decode_replicas


def pd_engine_config(
    base: VLLMEngineConfig,
    prefill_replicas: int,
    decode_replicas: int,
    connector: str = "ExampleConnector",
    shared_dir: str | None = None,
    extra: dict[str, object] | None = None,
) -> PDEngineConfig:
    """Both pools' configs from one engine config (its ``kv_transfer`` set per side)."""

    def side(role: Literal["kv_producer", "kv_consumer"]) -> VLLMEngineConfig:
        spec = KVTransferSpec(connector, role, shared_dir, dict(extra or {}))
        return dataclasses.replace(base, kv_transfer=spec)

    return PDEngineConfig(
        side("kv_producer"), side("kv_consumer"), prefill_replicas, decode_replicas
    )


def min_transfer_tokens(block_size: int) -> int:
    """The shortest prompt whose KV a connector moves at all.

    vLLM's connectors move whole KV blocks of the prompt but its last token (the
    decode side computes that one itself to sample from it): ``ExampleConnector``
    moves ``(len - 2) // block_size * block_size`` tokens of a ``len``-token
    prompt, so a prompt of up to ``block_size + 1`` tokens moves nothing and is
    computed whole on the decode side."""
    return block_size + 2


def no_transfer_reason(decode: VLLMEngineConfig, computed: int, longest_prompt: int) -> str:
    """Why the decode replicas (engine config ``decode``, with ``block_size`` and
    ``kv_transfer``) loaded no KV for ``computed`` prompt tokens: prompts shorter
    than the connector's blocks, or (prompts long enough) the connector itself."""
    block = getattr(decode, "block_size", None)
    spec = decode.kv_transfer
    assert spec is not None, "a PD decode replica's config has its kv_transfer side"
    head = (
        f"rollout/pd/kv_transfer_rate is 0: the decode replicas computed {computed} "
        f"prompt tokens and loaded none through {spec.connector}"
    )
    if block is None:
        return f"{head}; rollout.block_size is vLLM's default, set it (e.g. 32)"
    need = min_transfer_tokens(block)
    if longest_prompt < need:
        return (
            f"{head}: the connector moves whole rollout.block_size={block}-token blocks of "
            f"a prompt but its last token, so a prompt needs at least {need} tokens, and "
            f"the longest one sent has {longest_prompt}. PD pays off for long "
            "prompts: for these use rollout.pd.enabled=false"
        )
    where = f" (rollout.pd.shared_dir={spec.shared_dir})" if spec.shared_dir else ""
    return (
        f"{head}, although prompts of up to {longest_prompt} tokens "
        f"(rollout.block_size={block}) were sent: check that rollout.pd.connector works "
        f"here and that every replica sees the same KV store{where}"
    )


def prefill_request(request: GenerationRequest) -> GenerationRequest:
    """The prefill half of ``request``: same prompt ids and session, one greedy token."""
    return GenerationRequest(
        prompt_ids=list(request.prompt_ids),
        sampling=SamplingConfig(n=1, temperature=0.0, max_tokens=1),
        session_id=request.session_id,
    )


def clear_kv_store(spec: KVTransferSpec | None) -> None:
    """Delete the KV files a file connector stored (they hold the old weights' KV).

    Safe to call from several replicas at once on the same directory; callers
    make sure no request is in flight (see ``RolloutGroup.load_weights``).
    """
    if spec is None or spec.connector not in FILE_CONNECTORS or not spec.shared_dir:
        return
    if not os.path.isdir(spec.shared_dir):
        return
    for entry in os.listdir(spec.shared_dir):
        path = os.path.join(spec.shared_dir, entry)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass  # another replica removed it first


class PDRouter:
    """Two routers, one per pool. A session sticks to one decode replica (the
    ring over decode replicas) and to one prefill replica (a separate ring),
    so each side's prefix cache holds the conversation; independent requests
    go to the least-loaded replica of each pool.
    """

    def __init__(self, prefill_replicas: int, decode_replicas: int, vnodes: int = 128):
        self.prefill = Router(prefill_replicas, vnodes)
        self.decode = Router(decode_replicas, vnodes)

    def pick(self, session_id: str | None = None) -> tuple[int, int]:
        """(prefill replica, decode replica) for one request."""
        return self.prefill.pick(session_id), self.decode.pick(session_id)
