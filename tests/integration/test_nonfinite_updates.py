"""NaN or Inf in the loss or gradients: the update is skipped on every rank and
counted; ``trainer.max_bad_steps`` skipped steps in a row stop the run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch
from engine_utils import advantages, engine, free_port, make_batch, spawn

from algos import PolicyLossConfig
from rlpost.tiny import build_tiny_model


def _weights(eng) -> dict[str, torch.Tensor]:
    """Full weights (a collective: every rank calls it; rank 0 gets them)."""
    return {k: v.clone() for k, v in eng.named_weights() or []}


def _worker(rank: int, model_dir: str, port: int, out: str) -> None:
    eng = engine(model_dir, rank, 2, port, lr=1e-2, lr_warmup_steps=0, micro_batch_size=2)
    before = _weights(eng)
    batch = make_batch(seed=0)
    batch.advantages_bt = advantages(batch, seed=0)
    batch.old_logp_bt = eng.logprobs(batch)
    bad = make_batch(seed=0)
    bad.advantages_bt = batch.advantages_bt.clone()
    bad.advantages_bt[0, 4] = float("nan")  # one response token, on rank 0's shard only
    bad.old_logp_bt = batch.old_logp_bt
    skipped = eng.update_policy(bad.shard(rank, 2), PolicyLossConfig())
    after_bad = _weights(eng)
    good = eng.update_policy(batch.shard(rank, 2), PolicyLossConfig())
    after_good = _weights(eng)
    if rank == 0:
        torch.save(
            {"before": before, "after_bad": after_bad, "after_good": after_good,
             "skipped": skipped, "good": good},
            out,
        )  # fmt: skip
    eng.close()


def test_a_nan_update_is_skipped_on_every_rank_and_weights_stay(tmp_path):
    model_dir = str(build_tiny_model("micro", tmp_path / "m", seed=0))
    out = tmp_path / "out.pt"
    spawn(_worker, (model_dir, free_port(), str(out)), nprocs=2)
    r = torch.load(out)
    assert r["skipped"]["actor/skipped_updates"] == 1.0
    assert r["good"]["actor/skipped_updates"] == 0.0
    for name, w in r["before"].items():  # the NaN never reached the weights
        assert torch.equal(r["after_bad"][name], w), name
    assert all(torch.isfinite(w).all() for w in r["after_good"].values())
    assert any(not torch.equal(r["after_good"][n], w) for n, w in r["before"].items())
    # the schedule did not advance on the skipped step: lr is the same both times
    assert r["skipped"]["actor/lr"] == r["good"]["actor/lr"]


SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from algos import register_advantage
    from rlpost import compose, train

    @register_advantage("nan_after_2")
    def nan_after_2(cfg, *, scores_b, mask_bt, **_):
        nan_after_2.calls = getattr(nan_after_2, "calls", 0) + 1
        adv_b = scores_b["total"] - scores_b["total"].mean()
        if nan_after_2.calls > 2:  # steps 3.. go bad
            adv_b = adv_b * float("nan")
        return adv_b[:, None] * mask_bt, None

    cfg = compose(sys.argv[1:])
    train(cfg)
    """
)


def test_max_bad_steps_in_a_row_stop_the_run(tmp_path):
    script = tmp_path / "nan_run.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    args = [
        "algo.advantage.estimator=nan_after_2", "trainer.total_steps=10",
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
    import json

    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    skipped = {r["step"]: r["actor/skipped_updates"] for r in rows if r["step"] > 0}
    assert skipped == {1: 0.0, 2: 0.0, 3: 1.0, 4: 1.0}  # stopped at step 4, not 10
