"""The CLI with prefill/decode disaggregation on: a few GRPO steps on the micro
model, one prefill and one decode vLLM-CPU replica. After every weight sync the
decode replica's sampling log-probs equal the trainer's (both pools got the new
weights and no KV of the old ones was reused), and the decode side did load
the prompts' KV from the prefill side (prompts longer than a 32-token block)."""

from __future__ import annotations

import json

import pytest
from cli_utils import cli

from rlpost.models.tiny import build_tiny_model

pytest.importorskip("vllm")

# Completions of the random model differ in length: a reward with a signal in every group.
REWARD = "def score(completion, row):\n    return len(completion) / 8.0\n"


def test_cli_runs_grpo_steps_with_pd(tmp_path):
    model = build_tiny_model("micro", tmp_path / "micro", 0, init_std=0.3)
    (tmp_path / "reward.py").write_text(REWARD)
    for split, n in (("train", 32), ("val", 8)):
        rows = [{"prompt": f"Sequence {k}: " + "abcdefgh"[k % 8] * (30 + k % 9)} for k in range(n)]
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    args = [f"model.path={model}",
           "rollout.pd.enabled=true", "rollout.pd.prefill_replicas=1",
           "rollout.pd.decode_replicas=1", "rollout.block_size=32", "rollout.num_cpus=0.5",
           "trainer.total_steps=3", "trainer.val_every=0", "trainer.lr=1e-3",
           "data=files", f"data.train_files=[{tmp_path / 'train.jsonl'}]",
           f"data.val_files=[{tmp_path / 'val.jsonl'}]", "data.prompts_per_step=4",
           "rollout.n=4", "rollout.kv_cache_gib=0.0625",
           "reward=custom", f"reward.fn={tmp_path / 'reward.py'}:score",
           f"trainer.run_dir={run_dir}"]  # fmt: skip
    proc = cli(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        # Steps 2 and 3 sample after a weight sync: parity means both pools have it.
        assert r["rollout/logprob_abs_diff_max"] < 1e-3, r
        # Share of the decode side's uncached prompt tokens loaded from the connector
        # (whole 32-token blocks of 40-50-token prompts; the n children share them).
        assert r["rollout/pd/kv_transfer_rate"] > 0.1, r
        assert r["rollout/prefill0/requests"] == r["rollout/decode0/requests"]
    assert steps[-1]["actor/grad_norm"] > 0  # the policy was updated
