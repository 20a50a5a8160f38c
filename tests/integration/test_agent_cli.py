"""Agent mode through the real CLI: a custom environment and a custom tool on
user JSONL data, multi-turn episodes on vLLM, trainer/rollout log-prob parity
over the masked gaps, and bad agent specs stopped before Ray starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_utils import cli

from rlpost.models.tiny import build_tiny_model
from tests.cli_in_process import Finished, stop_ray

ROOT = Path(__file__).resolve().parents[2]
COMMON = [
    "algo=grpo", "data=files", "data.prompts_per_step=4", "rollout.n=4", "data.val_size=8",
    "rollout.max_tokens=8", "data.max_prompt_tokens=48", "rollout.max_model_len=160",
    "rollout.kv_cache_gib=0.0625", "trainer.val_every=0", "trainer.lr=1e-3",
    "trainer.logger=[jsonl]",
]  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_tiny_model("micro", tmp_path_factory.mktemp("agent-cli") / "m", seed=0)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cli(args: list[str], env: dict[str, str] | None = None) -> Finished:
    return cli(args, env, cwd=ROOT)


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _program_run(
    model: Path, tmp_path: Path, program: str, rows: list[dict], extra: list[str]
) -> tuple[Path, Path]:
    """A CLI run of an agent program on ``rows`` (and the same rows held out); its run
    folder and the file where the program logs each episode's sampled token counts."""
    train = _jsonl(tmp_path / "prog.jsonl", rows)
    val = _jsonl(tmp_path / "prog_val.jsonl", [{**r, "split": "val"} for r in rows])
    tokens = tmp_path / "tokens.jsonl"
    run_dir = tmp_path / "run"
    proc = _cli(
        [f"model.path={model}", *COMMON,
         f"data.train_files={train}", f"data.val_files={val}", "data.val_size=4",
         f"agent.program={program}", "agent.max_turns=3", "agent.max_response_tokens=64",
         f"trainer.run_dir={run_dir}", *extra],
        env={"RLPOST_TEST_TOKENS": str(tokens)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, tokens


def test_custom_environment_on_user_data_trains_multi_turn(model, tmp_path):
    rows = [{"prompt": "Guess my digit.", "secret": i % 10} for i in range(12)]
    train = _jsonl(tmp_path / "guess_train.jsonl", rows)
    val = _jsonl(tmp_path / "guess_val.jsonl", rows[:8])
    run_dir = tmp_path / "run"
    proc = _cli([
        f"model.path={model}", *COMMON, f"data.train_files={train}", f"data.val_files={val}",
        "agent.env=examples/agents/guess_env.py:GuessEnv", "agent.env_kwargs.max_guesses=3",
        "agent.max_turns=3", "agent.max_turn_tokens=8", "agent.max_response_tokens=64",
        "trainer.total_steps=2",
        f"trainer.run_dir={run_dir}",
    ])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [m for m in _metrics(run_dir) if m["step"] > 0]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        # a random model rarely names the digit at once: episodes run several turns
        assert 1.0 < m["agent/turns_mean"] <= 3.0
        assert m["agent/env_tokens_mean"] > 0 and m["agent/model_tokens_mean"] > 0
        assert m["agent/env_rewarded"] == 16  # every episode scored by the environment
        # trainer vs rollout log-probs on the sampled tokens of multi-turn sequences
        assert m["rollout/logprob_abs_diff_max"] < 1e-3
    # the environment's reward has no correctness signal: val/reward_mean, no val/accuracy
    assert "val/reward_mean" in _metrics(run_dir)[-1]


def test_custom_tool_with_column_style_reward(model, tmp_path):
    rows = [{"prompt": f"How many metres is {v} km?", "answer": v * 1000.0} for v in range(12)]
    train = _jsonl(tmp_path / "units.jsonl", rows)
    val = _jsonl(tmp_path / "units_val.jsonl", rows[:8])
    run_dir = tmp_path / "run"
    proc = _cli([
        f"model.path={model}", *COMMON, f"data.train_files={train}", f"data.val_files={val}",
        "reward=custom", "reward.fn=examples/agents/unit_reward.py:score",
        "agent.tools=examples/agents/unit_tool.py:convert", "trainer.total_steps=1",
        f"trainer.run_dir={run_dir}",
    ])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (m,) = [m for m in _metrics(run_dir) if m["step"] == 1]
    # the random model writes no tool call: one turn each, scored by reward.fn
    assert m["agent/turns_mean"] == 1.0 and m["agent/env_rewarded"] == 0
    assert m["reward/errors"] == 0 and m["agent/tool_calls"] == 0
    # rollout.max_tokens=8 is for single completions: a turn may use what the episode's
    # budget leaves (up to max_model_len 160 - the prompt), room for a tool call
    assert m["agent/model_tokens_mean"] > 8


def test_turns_cut_at_agent_max_turn_tokens_count_as_clipped(model, tmp_path):
    rows = [{"prompt": f"{a}*7=", "answer": str(a * 7)} for a in range(10, 22)]
    train = _jsonl(tmp_path / "calc.jsonl", rows)
    val = _jsonl(tmp_path / "calc_val.jsonl", rows[:8])
    run_dir = tmp_path / "run"
    proc = _cli([
        f"model.path={model}", *COMMON, f"data.train_files={train}", f"data.val_files={val}",
        "agent.tools=[multiply]", "agent.max_turn_tokens=4", "trainer.total_steps=1",
        f"trainer.run_dir={run_dir}",
    ])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (m,) = [m for m in _metrics(run_dir) if m["step"] == 1]
    # 4 tokens hold no call: the random model's turns are cut (an end token within
    # 4 of ~100 near-uniform choices is rare), each ends its episode unfinished
    assert m["agent/model_tokens_mean"] <= 4 * m["agent/turns_mean"]
    assert m["agent/turns_cut"] >= 8 and m["agent/tool_calls"] == 0
    assert m["response/clip_ratio"] >= 0.5 and m["agent/truncated"] >= 0.5
    # and the run says its chat template never shows the model the multiply tool
    assert "ignores tools=" in proc.stderr and "never shown multiply" in proc.stderr


def test_an_agent_program_trains_on_exactly_what_its_calls_sampled(model, tmp_path):
    modes = ["tool", "tool", "edit", "raise"]
    # no 'prompt' column: the program builds its messages from the row as it is
    rows = [{"question": f"{10 + i}*3=", "mode": m, "split": "train"} for i, m in enumerate(modes)]
    run_dir, tokens = _program_run(
        model, tmp_path, "tests/integration/programs/tool_agent.py:run", rows,
        ["agent.max_concurrent_episodes=6", "trainer.total_steps=2"],
    )  # fmt: skip
    steps = [m for m in _metrics(run_dir) if m["step"] > 0]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        # each step: 4 episodes of the raising row, 4 prefix breaks of the editing row
        assert m["agent/program_errors"] == 4 and m["agent/prefix_breaks"] == 4
        assert m["agent/env_rewarded"] == 16  # every program returned a reward, or failed (0)
        assert m["agent/env_tokens_mean"] > 0  # the tool turns, between the sampled ones
        assert m["agent/turns_mean"] == (2 + 2 + 2 + 1) / 4
        # trainer vs rollout log-probs on every captured (sampled) token
        assert m["rollout/logprob_abs_diff_max"] < 1e-3
    # The masks hold exactly the tokens the endpoint sampled: every call's tokens as
    # the agent's usage reports them. The editing rows' first calls (the segment
    # before the break) train as samples of their own episodes (agent.train_segments
    # defaults to all): 16 episodes and 4 more samples a step, nothing dropped.
    logged = [json.loads(x) for x in tokens.read_text().splitlines()]
    train_logged = [r for r in logged if r["split"] == "train"]
    assert len(train_logged) == 2 * 16
    sampled = sum(sum(r["tokens"]) for r in train_logged)
    before_break = sum(r["tokens"][0] for r in train_logged if r["mode"] == "edit")
    assert before_break > 0 and sum(m["agent/dropped_tokens"] for m in steps) == 0
    assert all(m["agent/split_samples"] == 4 and m["data/samples"] == 20 for m in steps)
    in_last_segments = sum(m["agent/model_tokens_mean"] * 16 for m in steps)
    assert round(in_last_segments) == sampled - before_break
    trained = sum(m["response/length_mean"] * m["data/samples"] for m in steps)
    assert round(trained) == sampled


def test_every_api_route_trains_on_exactly_what_it_sampled(model, tmp_path):
    """One run, one step: episodes through Chat Completions, Responses, Anthropic's
    Messages and the OpenAI Agents SDK (tests/integration/programs/all_routes.py),
    each captured token for token."""
    routes = ["chat", "responses", "messages", "agents"]
    rows = [
        {"question": f"{10 + i}*3=", "route": r, "split": "train"} for i, r in enumerate(routes)
    ]
    run_dir, tokens = _program_run(
        model, tmp_path, "tests/integration/programs/all_routes.py:run", rows,
        ["trainer.total_steps=1"],
    )  # fmt: skip
    (m,) = [m for m in _metrics(run_dir) if m["step"] == 1]
    assert m["agent/program_errors"] == 0 and m["agent/refused_requests"] == 0
    assert m["agent/prefix_breaks"] == 0 and m["data/samples"] == 16
    assert m["rollout/logprob_abs_diff_max"] < 1e-3
    logged = [json.loads(x) for x in tokens.read_text().splitlines() if '"train"' in x]
    assert sorted({r["route"] for r in logged}) == sorted(routes) and len(logged) == 16
    # what each API reported as its output tokens is what was trained, no more
    sampled = sum(sum(r["tokens"]) for r in logged)
    assert round(m["agent/model_tokens_mean"] * 16) == sampled
    assert round(m["response/length_mean"] * m["data/samples"]) == sampled


LIBRARY_ENVS = {
    # agent.env, its rows (one step trains 4 of them x 4 episodes)
    "trl_style": (
        "examples/agents/trl_style_env.py:CounterEnv",
        [{"prompt": f"Count to {k}.", "target": k} for k in range(1, 9)],
    ),
    "skyrl_gym": (
        "skyrl_gym:gsm8k",
        [
            {
                "prompt": f"What is {a}+{a}?",
                "reward_spec": {"method": "rule", "ground_truth": str(2 * a)},
            }
            for a in range(8)
        ],
    ),  # fmt: skip
    # the shortest opening of the single-player games (~200 tokens of the 256 positions)
    "textarena": ("textarena:Cryptarithm-v0", [{"prompt": "play", "seed": i} for i in range(8)]),
}


# skyrl_gym in every run; the other two with -m extended
@pytest.mark.parametrize(
    "library",
    [lib if lib == "skyrl_gym" else pytest.param(lib, marks=pytest.mark.extended)
     for lib in sorted(LIBRARY_ENVS)],
)  # fmt: skip
def test_other_libraries_environments_train_unchanged(library, model, tmp_path):
    pytest.importorskip(
        {"trl_style": "json", "skyrl_gym": "skyrl_gym", "textarena": "textarena"}[library]
    )
    spec, rows = LIBRARY_ENVS[library]
    data = _jsonl(tmp_path / f"{library}.jsonl", rows)
    run_dir = tmp_path / "run"
    proc = _cli([
        f"model.path={model}", *COMMON, f"data.train_files={data}", f"data.val_files={data}",
        "data.val_size=4", f"agent.env={spec}", "agent.max_turns=2", "agent.max_turn_tokens=16",
        "agent.max_response_tokens=96", "rollout.max_model_len=256",
        "data.max_prompt_tokens=240", "trainer.total_steps=1", f"trainer.run_dir={run_dir}",
    ])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (m,) = [m for m in _metrics(run_dir) if m["step"] == 1]
    # every episode's reward came from the library's environment, none from reward.fn
    assert m["agent/env_rewarded"] == 16 and m["reward/errors"] == 0
    assert 1.0 <= m["agent/turns_mean"] <= 2.0
    assert m["rollout/logprob_abs_diff_max"] < 1e-3


@pytest.mark.parametrize(
    "override, expected",
    [
        (
            "agent.tools=examples/agents/nope.py:convert",
            "agent.tools=['examples/agents/nope.py:convert']",
        ),
        ("agent.tools=examples/agents/unit_reward.py:score", "score has no docstring"),
        ("agent.env=examples/agents/unit_tool.py:TO_METRES", "not a class"),
        ("agent.env=examples/agents/guess_env.py:GuessEnv agent.env_kwargs.colour=1", "env kwargs"),
        ("agent.tools=calculator agent.parser=xml", "agent.parser=xml: tool-call parser 'xml'"),
        (
            "agent.program=examples/agents/guess_env.py:GuessEnv",
            "is a type, not a function",
        ),
        (
            "agent.program=examples/agents/openai_calculator.py:run "
            "agent.env=examples/agents/guess_env.py:GuessEnv",
            "agent.program and agent.env are both set",
        ),
    ],
)
def test_bad_agent_specs_are_config_errors_before_ray(
    override, expected, tmp_path, monkeypatch, capsys
):
    """Through ``rlpost.main.main`` in this process (test_cli_errors.py times the
    command itself exiting 2)."""
    import ray

    from rlpost.main import main

    stop_ray()  # the Ray this module's runs shared: this run must start none
    train = _jsonl(tmp_path / "t.jsonl", [{"prompt": "x", "secret": 1, "answer": 1.0}])
    monkeypatch.chdir(ROOT)
    code = main([
        *COMMON, f"data.train_files={train}", f"data.val_files={train}", *override.split(),
        f"trainer.run_dir={tmp_path / 'run'}",
    ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert expected in err, err[-2000:]
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def openenv_url():
    pytest.importorskip("openenv.core")
    from tests.openenv_server import number_guess_server

    with number_guess_server(max_sessions=32) as (url, _):  # 16 train + 4 val episodes at once
        yield url


def test_an_openenv_server_trains_unchanged(model, openenv_url, tmp_path):
    # examples/agents/openenv_number_guess.py, served by OpenEnv's own app
    data = _jsonl(tmp_path / "guess.jsonl", [{"prompt": "Guess.", "seed": i} for i in range(8)])
    run_dir = tmp_path / "run"
    proc = _cli([
        f"model.path={model}", *COMMON, f"data.train_files={data}", f"data.val_files={data}",
        "data.val_size=4", f"agent.env=openenv:{openenv_url}", "agent.max_turns=2",
        "agent.max_turn_tokens=16", "agent.max_response_tokens=96", "trainer.total_steps=1",
        f"trainer.run_dir={run_dir}",
    ])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (m,) = [m for m in _metrics(run_dir) if m["step"] == 1]
    # every episode's reward came from the server's environment, none from reward.fn
    assert m["agent/env_rewarded"] == 16 and m["reward/errors"] == 0
    assert 1.0 <= m["agent/turns_mean"] <= 2.0
    assert m["agent/env_tokens_mean"] > 0  # the game's feedback between the turns
    # the game's rewards: -0.1 a wrong guess, 0 no number, 1.0 the right one
    assert -0.2 - 1e-6 <= m["reward/mean"] <= 1.0
    assert m["rollout/logprob_abs_diff_max"] < 1e-3


def test_a_verifiers_environment_trains_unchanged(model, tmp_path):
    # tests/integration/programs/vf_sums.py: a verifiers 0.4 taskset, its tasks the
    # rows (data=verifiers), each episode one verifiers rollout with its chat harness
    pytest.importorskip("verifiers.v1")
    run_dir = tmp_path / "run"
    proc = _cli([
        f"model.path={model}", *COMMON, "data=verifiers", "data.val_size=4",
        "agent.program=verifiers:tests/integration/programs/vf_sums.py",
        'agent.env_kwargs.agent.harness.id="null"', "agent.max_turn_tokens=8",
        "agent.max_response_tokens=32", "trainer.total_steps=1", f"trainer.run_dir={run_dir}",
    ])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (m,) = [m for m in _metrics(run_dir) if m["step"] == 1]
    # every episode's reward came from the task's @vf.reward functions, none failed
    assert m["agent/env_rewarded"] == 16 and m["agent/program_errors"] == 0
    assert m["reward/errors"] == 0 and m["agent/turns_mean"] == 1.0
    # 1.0 * exact + 0.5 * short + 0.25 * replied: the untrained model's 8 tokens
    # are neither right nor short, but a reply (0.25) unless it ended at once
    assert 0.0 < m["reward/mean"] <= 1.75
    assert m["rollout/logprob_abs_diff_max"] < 1e-3
