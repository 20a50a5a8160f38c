"""``trainer.compile``: the FSDP2 engine with every decoder layer compiled
(``torch.compile``) steps as the eager engine does, within float32 rounding.

The CPU compiles for about a minute: with -m extended there, and on a GPU in
bench/gpu_check.sh (a test group of its own), which measures its speed too.
"""

from __future__ import annotations

import pytest
import torch
from engine_utils import DEVICES, advantages, engine, free_port, make_batch, spawn, to_cpu

from rlpost.algos import PolicyLossConfig
from rlpost.models.tiny import build_tiny_model


def _compiled_worker(rank: int, model_dir: str, out: str, device: str) -> None:
    """One ``update_policy`` step with eager decoder layers and one with compiled ones,
    from the same weights on the same batch; micro-batches of 3, 3 and 2 samples
    (two shapes: the second compiles again, with symbolic lengths)."""
    results = {}
    for compiled in (False, True):
        policy = engine(
            model_dir, rank, 1, free_port(), device, lr=1e-4, micro_batch_size=3,
            compile_layers=compiled,
        )  # fmt: skip
        batch = make_batch()
        batch.advantages_bt = advantages(batch)
        batch.old_logp_bt = policy.logprobs(batch)
        metrics = policy.update_policy(batch, PolicyLossConfig())
        grads = {n: p.grad for n, p in policy.model.named_parameters() if p.grad is not None}
        results[compiled] = to_cpu({"logp": batch.old_logp_bt, "grads": grads, "m": metrics})
        policy.close()
    torch.save(results, out)


@pytest.mark.extended
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_layers_update_like_eager_ones(device, tmp_path):
    model_dir = str(build_tiny_model("micro", tmp_path / "m", seed=0))
    out = tmp_path / "compiled.pt"
    spawn(_compiled_worker, (model_dir, str(out), device))
    got = torch.load(out)
    eager, compiled = got[False], got[True]
    mask = make_batch().response_mask_bt.bool()
    # float32 both ways; the compiled kernels add in another order
    torch.testing.assert_close(compiled["logp"][mask], eager["logp"][mask], rtol=0, atol=1e-5)
    assert compiled["grads"].keys() == eager["grads"].keys()
    for name, g in eager["grads"].items():
        torch.testing.assert_close(compiled["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert compiled["m"]["actor/loss"] == pytest.approx(eager["m"]["actor/loss"], rel=1e-5)
    assert eager["m"]["actor/grad_norm"] > 1e-3  # a real step
