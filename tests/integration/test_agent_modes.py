"""Agent episodes under the trainer's other modes: DAPO (dynamic sampling, overlong
shaping over the episode budget), PPO (a critic, GAE over the environment-token
gaps), one-step-off generation, LoRA and prefill/decode disaggregation. One Ray
session for all of them (``train`` reuses a connected Ray); the other presets
differ from these only in the loss and advantage math, whose handling of the
masked gaps ``tests/unit/test_agent_masks.py`` checks by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from rlpost.models.tiny import build_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODES = {
    "dapo": ["algo=dapo", "algo.dynamic_sampling.max_rounds=2"],
    # one run: PPO's critic and GAE over the environment's tokens, the policy a LoRA adapter
    "ppo_lora": ["algo=ppo", "model.lora.rank=4", "trainer.lr=2e-3"],
    "one_step_off": ["trainer.async_mode=one_step_off"],
    "pd": ["rollout=vllm_pd"],
}
SCRIPT = textwrap.dedent(
    """
    import json, sys
    import ray
    from rlpost import compose, train

    common, modes = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)  # logical: PPO has 4 roles
    for name, extra in modes.items():
        train(compose(common + extra + [f"trainer.run_dir={sys.argv[3]}/{name}"]))
        print("done", name, flush=True)
    """
)


# PPO (GAE over the environment's tokens) with LoRA in every run; DAPO, one-step-off
# and PD with -m extended.
@pytest.mark.parametrize(
    "modes",
    [("ppo_lora",), pytest.param(("dapo", "one_step_off", "pd"), marks=pytest.mark.extended)],
    ids=["ppo_lora", "dapo-one_step_off-pd"],
)
def test_agent_episodes_train_in_every_mode(tmp_path, modes):
    model = build_tiny_model("micro", tmp_path / "m", seed=0)
    rows = [{"prompt": "Guess my digit.", "secret": i % 10} for i in range(16)]
    data = tmp_path / "guess.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [
        "algo=grpo", f"model.path={model}", "data=files", f"data.train_files={data}",
        f"data.val_files={data}", "data.prompts_per_step=4", "rollout.n=4", "data.val_size=4",
        "rollout.max_tokens=8", "data.max_prompt_tokens=48", "rollout.max_model_len=160",
        "rollout.kv_cache_gib=0.0625", "trainer.val_every=0", "trainer.total_steps=2",
        "trainer.logger=[jsonl]", "trainer.save_final=false",
        "agent.env=examples/agents/guess_env.py:GuessEnv", "agent.max_turns=3",
        "agent.max_turn_tokens=8", "agent.max_response_tokens=48", "algo.overlong.buffer=8",
        "trainer.placement_timeout_s=30",
    ]  # fmt: skip
    script = tmp_path / "modes.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), json.dumps(common),
         json.dumps({m: MODES[m] for m in modes}), str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=REPO,
        env={**__import__("os").environ, "TQDM_DISABLE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    trained = 0  # steps that trained on samples, over every mode
    for name in modes:
        rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if r["step"] > 0]
        assert [r["step"] for r in steps] == [1, 2], name
        for r in steps:
            if r.get("data/samples", 0) == 0:
                # Only DAPO's dynamic sampling may drop a whole step (every group agreed
                # in every round); any other mode always trains on its samples.
                assert name == "dapo", (name, r)
                continue
            trained += 1
            assert r["agent/turns_mean"] > 1.0, name
            assert r["agent/env_tokens_mean"] > 0, name
            if name != "one_step_off":  # there the rollout is one update stale by design
                assert r["rollout/logprob_abs_diff_max"] < 1e-3, (name, r)
        if name == "ppo_lora":
            assert all("critic/vf_loss" in r for r in steps)
        if name == "one_step_off":
            assert steps[1]["rollout/staleness"] == 1.0
        if name == "pd":
            assert any(k.startswith("rollout/decode0/") for k in steps[0])
    # An empty step is the exception: at most DAPO's two, so 8 of the 10 steps trained.
    assert trained >= 2 * len(modes) - (2 if "dapo" in modes else 0), trained
