"""algo=sft on user chat data through the real CLI: the NLL of the assistant turns falls."""

from __future__ import annotations

import json

import pytest
from cli_utils import cli

from rlpost.models.tiny import build_tiny_model

pytest.importorskip("vllm")


def _chat(a: int, b: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"{a}+{b}="},
            {"role": "assistant", "content": str(a + b)},
            {"role": "user", "content": "twice?"},
            {"role": "assistant", "content": str(2 * (a + b))},
        ]
    }


def test_sft_on_multi_turn_chats(tmp_path):
    model = build_tiny_model("micro", tmp_path / "m", seed=0)
    train = tmp_path / "train.jsonl"
    val = tmp_path / "val.jsonl"
    train.write_text("".join(json.dumps(_chat(a, b)) + "\n" for a in range(8) for b in range(8)))
    val.write_text("".join(json.dumps(_chat(a, 9)) + "\n" for a in range(4)))
    run_dir = tmp_path / "run"
    args = [
        "algo=sft", "data=files",
        f"data.train_files=[{train}]", f"data.val_files=[{val}]", f"model.path={model}",
        "data.prompts_per_step=16", "trainer.lr=3e-3", "trainer.total_steps=12",
        "trainer.val_every=0", "rollout.kv_cache_gib=0.0625", f"trainer.run_dir={run_dir}",
    ]  # fmt: skip
    proc = cli(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    nll = [r["sft/nll"] for r in rows if "sft/nll" in r]
    assert len(nll) == 12
    # From a random model (~ln 104 = 4.6 per token) the NLL of the targets falls well below.
    assert nll[0] > 3.0
    assert nll[-1] < 0.7 * nll[0], nll
    # validation scored the last assistant turn (the 'answer' taken from the chat)
    assert "val/accuracy" in rows[-1]
    # and measured the training loss on the held-out chats (a + 9, never trained on):
    # the chat's form is learned, so it falls too
    assert rows[0]["step"] == 0 and rows[-1]["val/nll"] < 0.8 * rows[0]["val/nll"], rows
