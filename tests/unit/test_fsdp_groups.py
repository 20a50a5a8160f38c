"""One rank's FSDP2 groups (``rlpost.trainers.fsdp.common.layer_groups``): consecutive
decoder layers under a byte budget at 8 bytes a parameter."""

import torch

from rlpost.trainers.fsdp.common import layer_groups


def _layers(*sizes: int) -> torch.nn.ModuleList:
    """Layers of ``sizes`` parameters each (a bias-free n x 1 linear has n)."""
    return torch.nn.ModuleList([torch.nn.Linear(1, n, bias=False) for n in sizes])


def test_layers_fill_a_group_up_to_the_budget_in_order():
    layers = _layers(100, 100, 100, 100, 100)  # 800 bytes each
    groups = layer_groups(layers, 1600)
    assert [len(g) for g in groups] == [2, 2, 1]
    assert [m for g in groups for m in g] == list(layers)  # every layer once, in order
    assert [len(g) for g in layer_groups(layers, 2399)] == [2, 2, 1]
    assert [len(g) for g in layer_groups(layers, 2400)] == [3, 2]
    assert [len(g) for g in layer_groups(layers, 1 << 30)] == [5]


def test_a_layer_past_the_budget_is_a_group_of_its_own():
    # 800, 4000 and 800 bytes under a 1000-byte budget
    assert [len(g) for g in layer_groups(_layers(100, 500, 100), 1000)] == [1, 1, 1]
    assert [len(g) for g in layer_groups(_layers(100, 100), 0)] == [1, 1]
    assert layer_groups(torch.nn.ModuleList(), 1000) == []
