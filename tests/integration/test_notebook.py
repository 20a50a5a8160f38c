"""The notebook API: ``compose`` + ``train`` in one process, and ``examples/quickstart.ipynb``.

Both use a tiny random model (``model.path``) so they neither depend on nor
build the cached built-in model; the notebook's own default is the built-in one.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("vllm")

from rlpost.models.tiny import build_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"


def small_run(model: Path, run_dir: Path | None, steps: int) -> list[str]:
    out = [
        "algo=grpo", f"model.path={model}", f"trainer.total_steps={steps}",
        "trainer.val_every=1", "data.prompts_per_step=4", "rollout.n=2", "data.val_size=8",
        "rollout.kv_cache_gib=0.0625",
    ]  # fmt: skip
    return out + ([f"trainer.run_dir={run_dir}"] if run_dir else [])


# The quickstart notebook runs by default (below); two runs in one process, with
# -m extended (tests/e2e/test_presets_learn.py trains twice in one Ray by default).
@pytest.mark.extended
def test_train_twice_in_one_process(tmp_path: Path):
    """A second ``train`` in the same process works: the first left no Ray behind."""
    import ray

    from rlpost import compose, train

    model = build_tiny_model("micro", tmp_path / "model", seed=0)
    cwd = os.getcwd()
    assert not ray.is_initialized()
    # The second run trains multi-turn episodes: a custom environment on user rows.
    rows = "".join(f'{{"prompt": "Guess my digit.", "secret": {i % 10}}}\n' for i in range(8))
    (tmp_path / "guess.jsonl").write_text(rows)
    agent = [
        "data=files", f"data.train_files={tmp_path / 'guess.jsonl'}",
        f"data.val_files={tmp_path / 'guess.jsonl'}", "rollout.max_tokens=8",
        f"agent.env={REPO / 'examples/agents/guess_env.py'}:GuessEnv", "agent.max_turns=3",
        "agent.max_response_tokens=64",
    ]  # fmt: skip
    results = []
    for i, steps in enumerate((1, 2)):
        cfg = compose(small_run(model, tmp_path / f"run{i}", steps) + (agent if i else []))
        results.append(train(cfg))
        assert os.getcwd() == cwd
        assert not ray.is_initialized()  # it started Ray, so it stopped it
    for (i, result), steps in zip(enumerate(results), (1, 2)):
        assert result.run_dir == tmp_path / f"run{i}"
        assert [h["step"] for h in result.history] == list(range(steps + 1))
        assert all("val/reward_mean" in h for h in result.history)
        assert Path(result.final_model, "config.json").exists()
    # The second run's replica followed its own trainer, not a leftover one.
    assert results[1].history[-1]["rollout/logprob_abs_diff_max"] < 1e-3
    assert "agent/turns_mean" not in results[0].history[-1]
    assert all(1.0 < h["agent/turns_mean"] <= 3.0 for h in results[1].history[1:])


def test_quickstart_notebook_runs_end_to_end(tmp_path: Path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    model = build_tiny_model("micro", tmp_path / "model", seed=0)
    # As papermill does: a cell after the one tagged "parameters" overrides them.
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    # The notebook sets algo and the step count itself.
    extra = [o for o in small_run(model, None, 2) if not o.startswith(("algo=", "trainer.total"))]
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(f"STEPS = 2\nOVERRIDES = {extra!r}"))
    monkeypatch.setenv("TQDM_DISABLE", "1")  # the kernel inherits it: no progress bars
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    nbformat.write(nb, tmp_path / "executed.ipynb")  # for a look after a failure

    def text(cell) -> str:
        return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")

    code = [c for c in nb.cells if c.cell_type == "code"]
    # The run wrote under the notebook's directory (the default run_dir is relative).
    train_cell = next(c for c in code if "result = train(cfg)" in c.source)
    final = re.search(r"final model: (\S+)", text(train_cell))
    assert final and Path(final.group(1)).is_relative_to(tmp_path)
    assert (Path(final.group(1)) / "config.json").exists()
    plot_cell = next(c for c in code if "plt.show()" in c.source)
    assert any("image/png" in o.get("data", {}) for o in plot_cell.outputs)
    # The notebook reports the run's own held-out accuracies (metrics.jsonl), and the
    # run's two steps trained with a rollout that followed the trainer's weights.
    run_dir = re.search(r"run dir: (\S+)", text(train_cell))
    assert run_dir, text(train_cell)
    rows = [json.loads(line) for line in Path(run_dir.group(1), "metrics.jsonl").open()]
    logged = {r["step"]: r["val/accuracy"] for r in rows if "val/accuracy" in r}
    acc_cell = next(c for c in code if "val/accuracy:" in c.source)
    expected = f"val/accuracy: {logged[0]:.3f} at step 0 -> {logged[2]:.3f} at step 2"
    assert expected in text(acc_cell), text(acc_cell)
    steps = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/logprob_abs_diff_max"] < 1e-3 for r in steps), steps
    sample_cell = next(c for c in code if "model.generate" in c.source)
    lines = text(sample_cell).splitlines()
    assert [line.split("=")[0] for line in lines] == ["12+34", "57+8", "99+99", "40+21"]
