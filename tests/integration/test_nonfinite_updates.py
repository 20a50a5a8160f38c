"""NaN or Inf in the loss or gradients: the update is skipped on every rank and
counted; ``trainer.max_bad_steps`` skipped steps in a row stop the run, and a
good step in between starts the count again.

Injected for real: a NaN or Inf advantage on one rank's shard (a bad loss), a
NaN put into the gradient flowing back through one layer on one rank (a
finite loss with bad gradients), and NaN advantages on chosen steps of a CLI
run through a registered estimator."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import torch
from engine_utils import advantages, engine, free_port, make_batch, spawn

from rlpost.algos import PolicyLossConfig
from rlpost.models.tiny import build_tiny_model


def _weights(eng) -> dict[str, torch.Tensor]:
    """Full weights (a collective: every rank calls it; rank 0 gets them)."""
    return {k: v.clone() for k, v in eng.named_weights() or []}


# What each bad update injects, on one rank's shard only: the norm of the
# gradients is global, so every rank must see it and skip together.
BAD = {
    "NaN advantage on rank 0 (NaN loss)": ("advantage", float("nan"), 0),
    "Inf advantage on rank 1 (Inf loss)": ("advantage", float("inf"), 1),
    "NaN in rank 1's gradients alone (finite loss)": ("gradient", float("nan"), 1),
}


def _poison_gradient(eng, value: float):
    """A NaN/Inf in the gradient flowing back into layer 0's output, the forward
    untouched: the loss stays finite and only the gradients go bad."""

    def hook(grad):
        grad = grad.clone()
        grad.view(-1)[0] = value
        return grad

    def forward_hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden.register_hook(hook)

    return eng.model.model.layers[0].register_forward_hook(forward_hook)


def _worker(rank: int, model_dir: str, port: int, out: str) -> None:
    eng = engine(model_dir, rank, 2, port, lr=1e-2, lr_warmup_steps=0, micro_batch_size=2)
    before = _weights(eng)
    batch = make_batch(seed=0)
    batch.advantages_bt = advantages(batch, seed=0)
    batch.old_logp_bt = eng.logprobs(batch)
    results = {}
    for name, (where, value, on_rank) in BAD.items():
        bad = make_batch(seed=0)
        bad.advantages_bt = batch.advantages_bt.clone()
        bad.old_logp_bt = batch.old_logp_bt
        hook = None
        if where == "advantage":
            bad.advantages_bt[on_rank * 4, 4] = value  # a response token of that rank's shard
        elif rank == on_rank:
            hook = _poison_gradient(eng, value)
        results[name] = eng.update_policy(bad.shard(rank, 2), PolicyLossConfig())
        if hook is not None:
            hook.remove()
        results[name + " weights"] = _weights(eng)
    good = eng.update_policy(batch.shard(rank, 2), PolicyLossConfig())
    after_good = _weights(eng)
    if rank == 0:
        torch.save({"before": before, "bad": results, "after_good": after_good, "good": good}, out)
    eng.close()


def test_nan_or_inf_updates_are_skipped_on_every_rank_and_weights_stay(tmp_path):
    model_dir = str(build_tiny_model("micro", tmp_path / "m", seed=0))
    out = tmp_path / "out.pt"
    spawn(_worker, (model_dir, free_port(), str(out)), nprocs=2)
    r = torch.load(out)
    for name, (where, _, _) in BAD.items():
        m = r["bad"][name]
        assert m["actor/skipped_updates"] == 1.0, name
        assert not math.isfinite(m["actor/grad_norm"]), name
        assert math.isfinite(m["actor/pg_loss"]) == (where == "gradient"), (name, m)
        for param, w in r["before"].items():  # the bad update never reached the weights
            assert torch.equal(r["bad"][name + " weights"][param], w), (name, param)
        # the schedule did not advance on the skipped step: lr is the same as the good one's
        assert m["actor/lr"] == r["good"]["actor/lr"]
        print(f"{name}: update skipped on both ranks (actor/skipped_updates=1, grad_norm "
              f"{m['actor/grad_norm']}, pg_loss {m['actor/pg_loss']:.3g}), weights unchanged")  # fmt: skip
    assert r["good"]["actor/skipped_updates"] == 0.0
    assert all(torch.isfinite(w).all() for w in r["after_good"].values())
    assert any(not torch.equal(r["after_good"][n], w) for n, w in r["before"].items())


SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from rlpost.algos import register_advantage
    from rlpost import compose, train

    BAD_STEPS = {1, 3, 4}

    @register_advantage("nan_on_steps")
    def nan_on_steps(cfg, *, scores_b, mask_bt, **_):
        nan_on_steps.calls = getattr(nan_on_steps, "calls", 0) + 1  # one call per step
        adv_b = scores_b["total"] - scores_b["total"].mean()
        if nan_on_steps.calls in BAD_STEPS:
            adv_b = adv_b * float("nan")
        return adv_b[:, None] * mask_bt, None

    cfg = compose(sys.argv[1:])
    train(cfg)
    """
)


def test_max_bad_steps_in_a_row_stop_the_run_and_a_good_step_resets_the_count(tmp_path):
    script = tmp_path / "nan_run.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    args = [
        "algo.advantage.estimator=nan_on_steps", "trainer.total_steps=10",
        "trainer.max_bad_steps=2", "trainer.val_every=0", "data.prompts_per_step=4",
        "rollout.n=4", "model.preset=micro", "model.warmup.steps=0", "data.val_size=8",
        f"model.cache_dir={tmp_path / 'cache'}", f"trainer.run_dir={run_dir}",
        "trainer.logger=[jsonl]",
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "TQDM_DISABLE": "1"},
    )  # fmt: skip
    assert proc.returncode != 0
    assert "the update was skipped 2 steps in a row (trainer.max_bad_steps=2)" in proc.stderr
    assert "step 4:" in proc.stderr
    import json

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    skipped = {r["step"]: r["actor/skipped_updates"] for r in rows if r["step"] > 0}
    # bad, good (the count starts again), bad: still running; bad again: 2 in a row, stop
    assert skipped == {1: 1.0, 2: 0.0, 3: 1.0, 4: 1.0}
    print("NaN advantages on steps 1, 3 and 4 with trainer.max_bad_steps=2: steps 1 and 3 "
          "skipped and the run went on (step 2 was good); stopped at step 4, the second bad "
          "step in a row, not at step 10")  # fmt: skip
