"""RL on a vision-language model through the real CLI: user data rows whose
prompts hold an image, a tiny Qwen2-VL, vLLM sampling from the images, the
trainer's forward taking the processor's outputs, weight sync covering the
vision tower. The vision tower stays frozen (``model.freeze_vision``), the
language model trains, and the rollout samples from the trained policy."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("vllm")

from cli_utils import cli, metrics  # noqa: E402

from rlpost.models.vl import IMAGE_SIDE, build_vl_model  # noqa: E402
from rlpost.runtime.vl_compat import torchvision_available  # noqa: E402

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}
# A score that differs between almost any two completions, so every group has an advantage.
REWARD = "def score(completion, row):\n    return len(set(completion)) / 8.0\n"


def write_rows(tmp_path, n: int, name: str) -> str:
    from PIL import Image

    (tmp_path / "images").mkdir(exist_ok=True)
    rows = []
    for i in range(n):
        colour = list(COLOURS)[i % 3]
        file = f"images/{name}-{i}.png"
        Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), COLOURS[colour]).save(tmp_path / file)
        prompt = [{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": "Which colour is the picture?"},
        ]}]  # fmt: skip
        rows.append({"prompt": prompt, "images": [file], "answer": colour})
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_grpo_on_image_prompts_trains_the_language_model_only(tmp_path):
    from transformers import AutoModelForImageTextToText

    model = build_vl_model("Qwen2VLForConditionalGeneration", tmp_path / "vl", seed=0)
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    run_dir = tmp_path / "run"
    args = [
        "algo=grpo", f"model.path={model}", "data=files",
        f"data.train_files={write_rows(tmp_path, 12, 'train')}",
        f"data.val_files={write_rows(tmp_path, 6, 'val')}",
        "reward=custom", f"reward.fn={reward}:score", f"trainer.run_dir={run_dir}",
        "trainer.total_steps=2", "trainer.val_every=0", "data.prompts_per_step=4",
        "rollout.n=4", "rollout.max_tokens=8", "rollout.kv_cache_gib=0.0625",
        "trainer.lr=1e-3", "trainer.lr_warmup_steps=0",
    ]  # fmt: skip
    proc = cli(args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    if not torchvision_available():  # the run's last line says what AutoProcessor needs
        last = proc.stdout.strip().splitlines()[-1]
        assert last.startswith("note: torchvision is not installed")
        assert f"AutoProcessor.from_pretrained('{run_dir / 'final'}')" in last
        assert "`from rlpost.runtime.vl_compat import install; install()`" in last
    steps = [r for r in metrics(run_dir) if r["step"] > 0]
    assert len(steps) == 2
    # step 2 samples after a sync of every weight, vision tower included
    assert max(r["rollout/logprob_abs_diff_max"] for r in steps) < 1e-3
    assert all(r["actor/grad_norm"] > 0 for r in steps)

    before = AutoModelForImageTextToText.from_pretrained(model).state_dict()
    after = AutoModelForImageTextToText.from_pretrained(run_dir / "final").state_dict()
    assert before.keys() == after.keys()
    vision = [k for k in before if ".visual." in k]
    language = [k for k in before if ".language_model." in k]
    assert vision and language
    assert all(torch.equal(before[k], after[k]) for k in vision)  # frozen
    assert any(not torch.equal(before[k], after[k]) for k in language)  # trained
