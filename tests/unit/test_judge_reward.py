"""The generative judge's logic above its engine: templates, parsers, failures.
The engine is a scripted stand-in (``scripted``) returning fixed verdicts; the
CLI test runs a real judge engine (tests/integration/test_first_task_cli.py)."""

from __future__ import annotations

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.models.tiny import build_tiny_model, build_tiny_reward_model
from rlpost.plan.plan import build_plan
from rlpost.rewards.judge import JudgeReward, build_parser, check_template, prompt_text
from rlpost.rewards.loading import RewardError

ROW = {
    "prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+2="}],
    "answer": "4",
}


def scripted(verdicts):
    """A stand-in for the judge's engine: records the prompts, returns ``verdicts``."""
    seen: list[list[int]] = []

    def generate(prompts):
        seen.extend(prompts)
        return verdicts[: len(prompts)]

    return generate, seen


def test_the_default_parser_reads_the_score_and_counts_what_it_cannot():
    parse = build_parser(compose([]).reward.judge.parse)
    assert parse("Reasoning... Score: 7") == 7.0 and parse("Score:-2.5 done") == -2.5
    assert parse("I cannot grade this") is None
    generate, seen = scripted(["Score: 7", "no idea", "Score: 11.5"])
    judge = JudgeReward(
        "judge", "Q: {prompt} A: {completion} R: {answer}", parse,
        lambda text: [ord(c) for c in text], generate, max_error_frac=0.5,
    )  # fmt: skip
    scores, metrics = judge.score(["4", "5", "four"], [ROW] * 3)
    assert scores["judge"] == [7.0, 0.0, 11.5] and metrics["reward/errors"] == 1.0
    # the template reads the chat's last user turn, the completion and the answer
    assert "".join(map(chr, seen[0])) == "Q: 2+2= A: 4 R: 4"
    with pytest.raises(RewardError, match="2 of 3 verdicts did not parse"):
        strict = JudgeReward(
            "judge", "{completion}", parse, list, scripted(["x", "y", "Score: 1"])[0], 0.5
        )
        strict.score(["a", "b", "c"], [ROW] * 3)


def test_parsers_by_regex_group_or_function_and_bad_ones(tmp_path):
    assert build_parser(r"\d+")("grade 42 of 50") == 42.0  # no group: the whole match
    assert build_parser(r"(?:grade|mark) (\d+)")("mark 9") == 9.0
    with pytest.raises(RewardError, match="has 2 groups"):
        build_parser(r"(\d+)/(\d+)")
    with pytest.raises(RewardError, match="neither file.py:function nor a regular expression"):
        build_parser("Score: (")
    (tmp_path / "verdicts.py").write_text(
        "def yes_no(verdict):\n    return {'yes': 1.0, 'no': 0.0}.get(verdict.strip().lower())\n"
    )
    parse = build_parser(f"{tmp_path}/verdicts.py:yes_no")
    assert (parse(" Yes"), parse("no"), parse("maybe")) == (1.0, 0.0, None)
    assert prompt_text("plain") == "plain" and prompt_text(ROW["prompt"]) == "2+2="


def test_judge_config_errors_before_ray(tmp_path):
    assert check_template("{prompt} {completion} {answer} {level}", {"level"}) == []
    [problem] = check_template("{prompt} {difficulty}", {"prompt", "answer"})
    assert "['difficulty'], which the rows lack" in problem
    lm = build_tiny_model("micro", tmp_path / "lm", seed=0)
    rm = build_tiny_reward_model("micro", tmp_path / "rm", seed=0)
    with pytest.raises(ConfigError) as info:
        build_plan(compose([
            f"reward.judge.path={lm}", "reward.judge.template=Grade {completion} of {nope}",
            "reward.judge.parse=Score: (", "reward.judge.name=arith", "trainer.device=cpu",
        ]))  # fmt: skip
    text = str(info.value)
    assert "['nope'], which the rows lack" in text and "nor a regular expression" in text
    assert "reward.judge.name=arith: another reward has that name" in text
    with pytest.raises(ConfigError, match="reward.model.path=.*no classification head"):
        build_plan(compose([f"reward.model.path={lm}", "trainer.device=cpu"]))
    assert build_plan(compose([f"reward.model.path={rm}", "trainer.device=cpu"])) is not None
