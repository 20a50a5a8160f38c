"""Weights to vLLM replicas through vLLM's own weight-transfer engine
(``vllm.distributed.weight_transfer``, its dense NCCL backend): the path
``rollout.weight_sync=collective`` takes on CUDA where the installed vLLM has that
engine (``rlpost.serving.weight_group.vllm_transfer_backend``). Elsewhere the
collective sync is rlpost's own group (``rlpost.runtime.weight_wire.SyncGroup``).

- **The group.** Trainer rank 0 opens vLLM's trainer endpoint (NCCL rank 0, a
  stateless group of its own with a TCP rendezvous); each replica's workers join
  through the engine's ``init_weight_transfer_engine`` with ``worker_init_info``,
  at ranks from ``base_rank`` on.
- **The layout.** The names, shapes and dtypes of what is sent (``layout``) reach
  the workers from the controller once per group; each sync checks the tensors
  against it, so a disagreement is an error naming the tensor instead of a
  transfer that cuts its buckets differently on the two sides and hangs.
- **Buckets.** vLLM's packed broadcast: tensors joined into buckets of
  ``rollout.weight_sync_bucket_mb`` (a bucket closes once it passes that size),
  ``NUM_BUFFERS`` buckets in flight on each side.
- **Faults.** NCCL waits for a dead peer forever. ``watchdog`` aborts the
  communicator when a transfer outlives ``rollout.weight_sync_timeout_s``; the
  blocked call then fails, the controller restarts the replica that died and opens
  the group again, as with rlpost's own group.

CUDA only: not run on this project's CPU machines (no GPU was available). The
parts that need no device (the payloads, the bucket cuts against vLLM's own packer,
the watchdog) are tested on the CPU: tests/unit/test_vllm_transfer.py.
"""

from __future__ import annotations

import importlib.util
import math
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from rlpost.runtime import device as devices
from rlpost.runtime.weight_wire import SyncStats

if TYPE_CHECKING:
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

NUM_BUFFERS = 2  # buckets in flight on each side: the two-bucket bound of the sync
# vLLM's weight-transfer backend used: its dense NCCL engine, named as the CUDA backend is.
BACKEND = devices.kind(devices.CUDA).backend


def available() -> bool:
    """Whether the installed vLLM has its weight-transfer engine with the NCCL backend."""
    try:
        return importlib.util.find_spec("vllm.distributed.weight_transfer.nccl_engine") is not None
    except ModuleNotFoundError:  # no vLLM, or one without ``vllm.distributed.weight_transfer``
        return False


Specs = list[tuple[str, tuple[int, ...], torch.dtype]]


def specs_of(layout: dict[str, list]) -> Specs:
    """The specs ``layout`` lists (its inverse)."""
    return [
        (name, tuple(shape), getattr(torch, dtype))
        for name, dtype, shape in zip(layout["names"], layout["dtype_names"], layout["shapes"])
    ]


def layout(specs: Specs) -> dict[str, list]:
    """The update info vLLM's NCCL engine receives by (``NCCLWeightTransferUpdateInfo``):
    every tensor's name, dtype name and shape, in the order they are sent."""
    return {
        "names": [name for name, _, _ in specs],
        "dtype_names": [str(dtype).removeprefix("torch.") for _, _, dtype in specs],
        "shapes": [list(shape) for _, shape, _ in specs],
    }


def worker_init_info(
    address: str, base_rank: int, world_size: int, bucket_bytes: int
) -> dict[str, str | int | bool]:
    """What a replica's workers pass to vLLM's ``init_weight_transfer_engine``
    (``NCCLWeightTransferInitInfo``): the trainer's rendezvous at ``address``
    (``host:port``, ``tcp://`` optional), the group's size, the first worker's rank,
    and the packing both sides must agree on."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    return {
        "master_address": host,
        "master_port": int(port),
        "rank_offset": base_rank,
        "world_size": world_size,
        "packed": True,
        "packed_buffer_size_bytes": bucket_bytes,
        "packed_num_buffers": NUM_BUFFERS,
    }


def bucket_sizes(specs: Specs, bucket_bytes: int) -> list[int]:
    """The bytes of each bucket vLLM's packer makes of ``specs``: tensors join a
    bucket until it holds more than ``bucket_bytes``."""
    sizes: list[int] = []
    current = 0
    for _, shape, dtype in specs:
        current += math.prod(shape) * dtype.itemsize
        if current > bucket_bytes:
            sizes.append(current)
            current = 0
    if current:
        sizes.append(current)
    return sizes


def figures(specs: Specs, bucket_bytes: int) -> dict[str, int]:
    """A sync's figures as ``SyncStats`` reports them: buckets, bytes, and the most
    bytes of buckets in flight at once (``NUM_BUFFERS`` neighbours)."""
    sizes = bucket_sizes(specs, bucket_bytes)
    peak = max(
        (sum(sizes[i : i + NUM_BUFFERS]) for i in range(len(sizes))), default=0
    )  # fmt: skip
    return {"buckets": len(sizes), "bytes": sum(sizes), "peak": peak}


def checked(
    items: Iterator[tuple[str, torch.Tensor]], specs: Specs, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    """``items`` on ``device``, each checked against ``specs`` (what the workers were
    told to expect): a name, shape or dtype that differs, or a tensor too many or
    too few, raises naming it."""
    sent = 0
    for name, tensor in items:
        if sent >= len(specs):
            raise ValueError(
                f"weight sync: the trainer sent more tensors than its layout lists "
                f"({len(specs)}); the first extra is {name!r}"
            )
        want = specs[sent]
        got = (name, tuple(tensor.shape), tensor.dtype)
        if got != (want[0], tuple(want[1]), want[2]):
            raise ValueError(
                f"weight sync: tensor {sent} is {got}, but the layout the replicas "
                f"received lists {want}; the layout is taken when the group opens"
            )
        sent += 1
        yield name, tensor.to(device)
    if sent != len(specs):
        raise ValueError(
            f"weight sync: the trainer sent {sent} tensors, its layout lists {len(specs)}"
        )


@contextmanager
def watchdog(timeout_s: float, abort: Callable[[], None], what: str) -> Iterator[None]:
    """Run the block; if it has not ended after ``timeout_s``, call ``abort`` (from
    another thread: it must make the blocked call fail) and raise ``TimeoutError``
    naming ``what`` once the block ends."""
    done = threading.Event()
    fired = threading.Event()

    def watch() -> None:
        if not done.wait(timeout_s):
            fired.set()
            abort()

    thread = threading.Thread(target=watch, name="rlpost-weight-watchdog", daemon=True)
    thread.start()
    try:
        yield
    except BaseException as exc:
        if fired.is_set():
            raise TimeoutError(f"{what} took longer than {timeout_s:g} s and was aborted") from exc
        raise
    finally:
        done.set()
        thread.join()
    if fired.is_set():
        raise TimeoutError(f"{what} took longer than {timeout_s:g} s and was aborted")


class VllmNcclSender:
    """Trainer rank 0's end of vLLM's NCCL weight transfer: opens the group (it
    returns once every worker has joined) and broadcasts bucket by bucket from
    ``device``. ``send`` and ``close`` are ``SyncGroup``'s, so the trainer sends
    through either the same way."""

    def __init__(self, address: str, world_size: int, timeout_s: float, device: torch.device):
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        host, _, port = address.removeprefix("tcp://").rpartition(":")
        self.timeout_s, self.device = timeout_s, device
        info = {"master_address": host, "master_port": int(port), "world_size": world_size}
        self.comm: PyNcclCommunicator | None = trainer_init(info)

    def send(
        self, items: Iterator[tuple[str, torch.Tensor]], bucket_bytes: int, specs: Specs
    ) -> SyncStats:
        """Broadcast ``items`` (in ``specs``' order; a sharded trainer gathers each as
        the iterator reaches it); returns the sync's figures (``figures``)."""
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

        if self.comm is None:
            raise RuntimeError("weight sync: the group was aborted; open it again")
        with (
            watchdog(self.timeout_s, self.close, "sending the weights to the replicas"),
            warnings.catch_warnings(),
        ):
            # a tensor larger than a bucket gets a bucket of its own, as designed
            warnings.filterwarnings("ignore", "Tensor .* exceeds buffer_size_bytes")
            packed_nccl_broadcast_producer(
                iterator=checked(items, specs, self.device),
                group=self.comm,
                src=0,
                post_iter_func=lambda item: item[1],
                buffer_size_bytes=bucket_bytes,
                num_buffers=NUM_BUFFERS,
            )
        sent = figures(specs, bucket_bytes)
        return SyncStats(sent["buckets"], sent["bytes"], sent["peak"])

    def close(self) -> None:
        """Abort the communicator (safe while a call on it is blocked)."""
        comm, self.comm = self.comm, None
        if comm is not None:
            comm.destroy()
