"""Methods added to every vLLM worker (``worker_extension_cls``).

Names are prefixed ``rlpost_`` so they never clash with the worker's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rlpost.rollout.base import IpcTensorSource, WeightLayout

# Parameters vLLM computes from loaded ones after loading, with no checkpoint name:
# multi-head latent attention's (DeepSeek) W_UK_T and W_UV, split from kv_b_proj.
DERIVED_PARAMETERS = ("W_UK_T", "W_UV")


class WeightSyncExtension:
    def rlpost_load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """Reload weights in place through the model runner (works for CPU-processed
        layers); returns how many tensors were given.

        Every parameter of the engine's model must be written: a parameter that no
        given name reached (a name the model's loader skips, e.g. a fused-expert
        name where it expects per-expert ones) raises, naming it, instead of leaving
        the rollout sampling from stale weights.
        """
        return self._rlpost_reload(iter(named_tensors))

    def rlpost_open_weight_group(
        self, address: str, base_rank: int, world_size: int, generation: int, timeout_s: float
    ) -> None:
        """Join the weight group (``rlpost.runtime.weight_wire.SyncGroup``) as rank
        ``base_rank`` plus this worker's rank in its engine; the trainer is rank 0."""
        from rlpost.runtime.device import weight_group_backend
        from rlpost.runtime.weight_wire import SyncGroup

        host, _, port = address.rpartition(":")
        old = getattr(self, "_rlpost_weight_group", None)
        if old is not None:
            old.close()
        device = getattr(self, "device", None)
        self._rlpost_weight_group = SyncGroup(
            host, int(port), base_rank + int(getattr(self, "rank", 0)), world_size,
            backend=weight_group_backend(device), timeout_s=timeout_s, generation=generation,
            device=device if isinstance(device, torch.device) else None,
        )  # fmt: skip

    def rlpost_receive_weights(self) -> dict[str, int]:
        """Reload from the buckets rank 0 broadcasts; the tensors go to the model's
        loader as views of the bucket that holds them, one bucket at a time."""
        from rlpost.runtime.weight_wire import SyncStats

        stats = SyncStats()
        self._rlpost_reload(self._rlpost_weight_group.receive(stats))
        return {"buckets": stats.buckets, "bytes": stats.bytes, "peak": stats.peak_bucket_bytes}

    def rlpost_receive_weights_ipc(self, source: IpcTensorSource) -> dict[str, int]:
        """Reload from the buckets a colocated trainer hands out (``source``:
        ``rlpost.workers.ipc_source.IpcSource``), each mapped in place and read by
        the model's loader before the next is asked for. The engine runs its workers
        in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so ``source`` arrives
        as it was given."""
        from rlpost.runtime.weight_wire import SyncStats

        stats = SyncStats()
        self._rlpost_reload(source.tensors(stats))
        return {"buckets": stats.buckets, "bytes": stats.bytes, "peak": stats.peak_bucket_bytes}

    def rlpost_open_vllm_transfer(self, init_info: Mapping[str, object]) -> None:
        """Join the trainer's weight group through vLLM's own weight-transfer engine
        (the engine's ``weight_transfer_config``; ``init_info``:
        ``rlpost.runtime.vllm_transfer.worker_init_info``), after releasing the
        group of an earlier generation."""
        self.shutdown_weight_transfer_engine()  # type: ignore[attr-defined]
        self.init_weight_transfer_engine(init_info)  # type: ignore[attr-defined]

    def rlpost_receive_weights_vllm(
        self, layout: WeightLayout, timeout_s: float, bucket_bytes: int
    ) -> dict[str, int]:
        """Reload through vLLM's own weight transfer: its start, the packed broadcast
        (``layout``: the names, dtypes and shapes sent) into the model's loader, its
        finish, with ``_rlpost_reload``'s check that every parameter was written.
        Past ``timeout_s`` the communicator is aborted and this raises."""
        from rlpost.runtime import vllm_transfer

        transfer = self.weight_transfer_engine  # type: ignore[attr-defined]
        if transfer is None:
            raise RuntimeError("the engine was built without weight_transfer_config")

        def receive(_: Iterator[tuple[str, torch.Tensor]]) -> None:
            with vllm_transfer.watchdog(timeout_s, transfer.shutdown, "receiving the weights"):
                self.start_weight_update()  # type: ignore[attr-defined]
                self.update_weights(layout)  # type: ignore[attr-defined]
                self.finish_weight_update()  # type: ignore[attr-defined]

        self._rlpost_checked(transfer.model, None, receive)
        return vllm_transfer.figures(vllm_transfer.specs_of(layout), bucket_bytes)

    def _rlpost_reload(self, named_tensors: Iterator[tuple[str, torch.Tensor]]) -> int:
        model = self.model_runner.get_model()  # type: ignore[attr-defined]

        def reload(weights: Iterator[tuple[str, torch.Tensor]]) -> None:
            self.model_runner.reload_weights(weights_iterator=weights)  # type: ignore[attr-defined]

        return len(self._rlpost_checked(model, named_tensors, reload))

    def _rlpost_checked(
        self,
        model: torch.nn.Module,
        named_tensors: Iterator[tuple[str, torch.Tensor]] | None,
        load: Callable[[Iterator[tuple[str, torch.Tensor]]], None],
    ) -> list[str]:
        """Run ``load`` with the model's loader recording what it wrote, then raise
        if a parameter of the model was not written. ``load`` gets ``named_tensors``
        made ready (the tied head dropped where the model has no head of its own,
        each name recorded) to hand the loader; None: the tensors reach the loader
        in lists from elsewhere (vLLM's weight transfer) and get the same treatment
        there. Returns the names given."""
        headless = not any(name.endswith("lm_head") for name, _ in model.named_modules())
        given: list[str] = []
        bucketed = named_tensors is None
        named_tensors = _counted(_heads(named_tensors or iter(()), headless), given)
        expected = {
            name.replace(".base_layer.", ".")
            for name, _ in model.named_parameters()
            if name.rpartition(".")[2] not in DERIVED_PARAMETERS
        }
        written: set[str] = set()
        checked = True
        # the vLLM model's own, not torch's (which types a module's attributes as
        # tensors or modules)
        loader: Any = model.load_weights

        def load_and_record(weights):  # what the model's own loader reports it wrote
            nonlocal checked
            if bucketed:  # a bucket handed over whole (vLLM's transfer)
                weights = list(_heads(iter(weights), headless))
                given.extend(name for name, _ in weights)
            names = loader(weights)
            if names is None:
                checked = False
            else:
                written.update(names)
            return names

        model.load_weights = load_and_record  # type: ignore[method-assign,assignment]
        try:
            load(named_tensors)
        finally:
            del model.load_weights
        _repack_cpu_experts(model)
        missing = sorted(expected - written) if checked else []
        if missing:
            raise ValueError(
                f"weight sync left {len(missing)} rollout parameter(s) unwritten, e.g. "
                f"{missing[:5]}; the trainer sent {len(given)} tensors named like "
                f"{given[:3]}: the names do not match what the engine's loader expects"
            )
        return given


def _heads(
    named_tensors: Iterator[tuple[str, torch.Tensor]], headless: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` without the tied head where the model has no head module
    (vLLM's Gemma 2 computes logits from the embedding): the tied copy has nowhere
    to go, its twin does."""
    if not headless:
        return named_tensors
    return ((n, t) for n, t in named_tensors if not n.startswith("lm_head."))


def _counted(
    named_tensors: Iterator[tuple[str, torch.Tensor]], names: list[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The same tensors, each name recorded in ``names`` as it passes."""
    for name, tensor in named_tensors:
        names.append(name)
        yield name, tensor


def _repack_cpu_experts(model: torch.nn.Module) -> int:
    """Pack reloaded MoE expert weights into the CPU kernel's layout again.

    On the CPU, vLLM's unquantized MoE experts repack ``w13_weight`` and
    ``w2_weight`` into a grouped-gemm layout once, when the kernel is first
    built. An in-place reload writes the checkpoint layout back into those
    parameters but skips the packing (it runs only on that first build), so the
    kernel would read plain weights as packed ones: log-probs off by ~15 nats on
    a tiny Qwen3-MoE. Returns how many layers were packed.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    packed = 0
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if not isinstance(experts, CPUUnquantizedExperts):
            continue
        moe = experts.moe_config
        if experts._padded_intermediate_size(moe) != moe.intermediate_size_per_partition:
            # The load padded the intermediate dimension; a reload writes the
            # unpadded checkpoint rows into the padded parameter.
            raise ValueError(
                f"{name}: weight sync into a CPU MoE layer whose intermediate size "
                f"({moe.intermediate_size_per_partition}) is not a multiple of "
                f"{experts._intermediate_alignment()} is not supported"
            )
        experts.process_weights_after_loading(module)
        packed += 1
    return packed
