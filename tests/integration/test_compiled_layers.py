"""``trainer.compile``: the FSDP2 engine with every decoder layer and the log-prob
chunk kernels compiled (``torch.compile``) steps as the eager engine does, within
float32 rounding.

The model has two decoder layers (one compile serves both) and a vocabulary of
262,144: a micro-batch's logits, 2 or 3 x 13 x 262,144, are past the plain path's
4 M elements, so the output layer runs a chunk at a time through the compiled
kernels (``rlpost.trainers.chunk_kernels``).

The CPU compiles for about a minute: with -m extended there, and on a GPU in
bench/gpu_check.sh (a test group of its own), which measures its speed too.
"""

from __future__ import annotations

import pytest
import torch
from engine_utils import DEVICES, advantages, engine, free_port, make_batch, spawn, to_cpu

from rlpost.algos import PolicyLossConfig


def _compiled_worker(rank: int, model_dir: str, out: str, device: str) -> None:
    """One ``update_policy`` step of the eager engine and one of the compiled engine,
    from the same weights on the same batch; micro-batches of 3, 3 and 2 samples
    (two shapes: the second compiles again, with symbolic lengths)."""
    results = {}
    for compiled in (False, True):
        policy = engine(
            model_dir, rank, 1, free_port(), device, lr=1e-4, micro_batch_size=3,
            compile=compiled,
        )  # fmt: skip
        batch = make_batch()
        batch.advantages_bt = advantages(batch)
        batch.old_logp_bt = policy.logprobs(batch)
        metrics = policy.update_policy(batch, PolicyLossConfig())
        grads = {n: p.grad for n, p in policy.model.named_parameters() if p.grad is not None}
        result = {"logp": batch.old_logp_bt, "grads": grads, "m": metrics}
        results[compiled] = to_cpu({**result, "fused": policy._head is not None})
        policy.close()
    torch.save(results, out)


@pytest.mark.extended
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_layers_update_like_eager_ones(device, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=1 << 18, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
        initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "m")
    out = tmp_path / "compiled.pt"
    spawn(_compiled_worker, (str(tmp_path / "m"), str(out), device))
    got = torch.load(out)
    eager, compiled = got[False], got[True]
    assert eager["fused"] and compiled["fused"]  # the output layer folded into the log-probs
    mask = make_batch().response_mask_bt.bool()
    # float32 both ways; the compiled kernels add in another order
    torch.testing.assert_close(compiled["logp"][mask], eager["logp"][mask], rtol=0, atol=1e-5)
    assert torch.all(compiled["logp"][~mask] == 0)
    assert compiled["grads"].keys() == eager["grads"].keys()
    for name, g in eager["grads"].items():
        torch.testing.assert_close(compiled["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert compiled["m"]["actor/loss"] == pytest.approx(eager["m"]["actor/loss"], rel=1e-5)
    assert eager["m"]["actor/grad_norm"] > 1e-3  # a real step
