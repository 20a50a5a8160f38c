"""Every tensor handed to a collective lives on its process group's device.

NCCL (CUDA) and HCCL (Ascend) take no CPU tensors; gloo does. A collective over a
tensor built on the CPU passes every test on the CPU and crashes on the first GPU
step (it did: ``global_norm``'s counts under NCCL). So the packages call
``torch.distributed``'s tensor collectives in one module only,
``rlpost.trainers.distributed``, whose helpers put each tensor on the group's
device (``rlpost.runtime.device.collective_device``); this test reads every call
in the packages and names any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("rlpost", "algos", "rollout", "runtime", "trainers")
HOME = "trainers/distributed.py"
# torch.distributed's collectives that take tensors (the object ones pickle onto the
# right device themselves; a barrier takes none)
TENSOR_COLLECTIVES = frozenset(
    "all_reduce all_gather all_gather_into_tensor reduce_scatter reduce_scatter_tensor "
    "broadcast reduce gather scatter all_to_all all_to_all_single send recv isend irecv "
    "batch_isend_irecv all_reduce_coalesced all_gather_coalesced".split()
)


def collective_calls(source: str) -> list[tuple[int, str]]:
    """(line, name) of each tensor collective of ``torch.distributed`` that ``source``
    calls: through any name the module is imported as, or imported by name."""
    tree = ast.parse(source)
    modules, names = {"torch.distributed"}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch.distributed":
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            for alias in node.names:
                if alias.name in TENSOR_COLLECTIVES:
                    names[alias.asname or alias.name] = alias.name
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in TENSOR_COLLECTIVES:
            if ast.unparse(f.value) in modules:
                found.append((node.lineno, f.attr))
        elif isinstance(f, ast.Name) and f.id in names:
            found.append((node.lineno, names[f.id]))
    return found


def test_collectives_are_called_only_through_the_device_placing_helpers():
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == HOME:
                continue
            for line, name in collective_calls(path.read_text()):
                found.append(f"{rel}:{line}: torch.distributed.{name}")
    assert not found, (
        f"call the collective through {HOME} (all_reduce_, broadcast_, all_gather, "
        "gather_into), which puts the tensor on its group's device:\n" + "\n".join(found)
    )


def test_the_check_finds_each_way_of_calling_a_collective():
    # the form update.py had before the fix, an alias, a direct import, a renamed one
    assert collective_calls("import torch.distributed as dist\ndist.all_reduce(counts)\n") == [
        (2, "all_reduce")
    ]
    assert collective_calls("import torch\ntorch.distributed.broadcast(t, 0)\n") == [
        (2, "broadcast")
    ]
    assert collective_calls("from torch.distributed import all_gather as ag\nag(parts, x)\n") == [
        (2, "all_gather")
    ]
    # not collectives over tensors: an object gather, a barrier, a pipe's send
    assert not collective_calls(
        "import torch.distributed as dist\ndist.all_gather_object(o, k)\ndist.barrier()\n"
        "conn.send(x)\n"
    )


@pytest.mark.parametrize(
    ("backend", "device"),
    [("gloo", "cpu"), ("cpu:gloo,npu:hccl", "cpu"), ("GLOO", "cpu")],
)
def test_the_device_of_a_cpu_capable_backend_is_the_cpu(backend, device):
    from rlpost.runtime import device as devices

    assert devices.collective_device(backend) == torch.device(device)


def test_an_unknown_backend_is_named():
    from rlpost.runtime import device as devices

    with pytest.raises(ValueError, match="'mpi'"):
        devices.collective_device("mpi")


def test_the_helpers_reduce_and_broadcast_in_place_under_gloo(tmp_path):
    """One gloo rank: the sum and the broadcast land in the tensor given, which is
    also what the helper returns (a CPU tensor under gloo never moves)."""
    import torch.distributed as dist

    from rlpost.trainers.distributed import all_gather, all_reduce_, broadcast_, group_device

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        assert group_device() == torch.device("cpu")
        counts = torch.tensor([3.0, 2.0], dtype=torch.float64)
        assert all_reduce_(counts) is counts and counts.tolist() == [3.0, 2.0]
        x = torch.arange(4.0)
        assert broadcast_(x, 0) is x and x.tolist() == [0.0, 1.0, 2.0, 3.0]
        [part] = all_gather(torch.ones(2, 3).t())  # not contiguous: gathered as a copy
        assert part.shape == (3, 2) and part.is_contiguous()
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_a_cpu_tensor_is_reduced_through_the_gpu_under_nccl(tmp_path):
    """What crashed the first GPU update: a CPU tensor all-reduced under NCCL."""
    import torch.distributed as dist

    from rlpost.trainers.distributed import all_reduce_, group_device

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        assert group_device().type == "cuda"
        counts = torch.tensor([5.0, 1.0], dtype=torch.float64)  # on the CPU
        assert all_reduce_(counts) is counts and counts.device.type == "cpu"
        assert counts.tolist() == [5.0, 1.0]
    finally:
        dist.destroy_process_group()
