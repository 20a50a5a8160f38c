"""An environment written for OpenEnv (``openenv-core``), served as OpenEnv serves any
environment and trained by rlpost as is:

    python examples/agents/openenv_number_guess.py --port 8000 --max-sessions 64 &
    python -m rlpost.main algo=grpo data=files data.train_files=guess.jsonl \\
        data.val_files=guess.jsonl agent.env=openenv:http://127.0.0.1:8000

or through its client class, ``agent.env=openenv:examples/agents/openenv_number_guess.py:NumberGuessEnv
agent.env_kwargs.base_url=http://127.0.0.1:8000``. Rows: ``{"prompt": "Play.", "seed": 3}``.

The secret is ``1 + seed % 20``; the model has three guesses. Each wrong guess
scores -0.1 and says "higher" or "lower"; the right one scores 1.0 and ends the
game; a turn without a number scores nothing and uses a guess; a number outside
1-20 is an error (the step raises, the server answers with the error, the guess
is not used). The action's ``verbose`` (rlpost: ``agent.env_kwargs.action_defaults.verbose=true``)
adds how many guesses are left to the feedback.
"""

from __future__ import annotations

import re

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

GUESSES = 3


class NumberGuessAction(Action):
    guess: str = Field(..., description="The model's turn; its first number is the guess")
    verbose: bool = Field(default=False, description="Say how many guesses are left")


class NumberGuessObservation(Observation):
    feedback: str = Field(default="", description="What the game says")
    guesses_left: int = Field(default=GUESSES)


class NumberGuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own instance

    def __init__(self):
        super().__init__()
        self.secret, self.left = 1, GUESSES
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs):
        self.secret, self.left = 1 + (seed or 0) % 20, GUESSES
        self._state = State(episode_id=episode_id, step_count=0)
        return NumberGuessObservation(
            feedback=f"I picked a number between 1 and 20. You have {GUESSES} guesses."
        )

    def step(self, action: NumberGuessAction, timeout_s=None, **kwargs):
        found = re.search(r"-?\d+", action.guess)
        guess = int(found.group()) if found else None
        if guess is not None and not 1 <= guess <= 20:
            raise ValueError(f"{guess} is not between 1 and 20")
        self._state.step_count += 1
        self.left -= 1
        if guess == self.secret:
            return NumberGuessObservation(
                feedback="Correct!", guesses_left=self.left, done=True, reward=1.0
            )
        done = self.left == 0
        if guess is None:
            feedback, reward = "Answer with a number.", None
        else:
            feedback, reward = ("Higher." if guess < self.secret else "Lower."), -0.1
        if action.verbose:
            feedback += f" {self.left} guesses left."
        return NumberGuessObservation(
            feedback=feedback, guesses_left=self.left, done=done, reward=reward
        )

    @property
    def state(self) -> State:
        return self._state


class NumberGuessEnv(EnvClient[NumberGuessAction, NumberGuessObservation, State]):
    """The game's client, as OpenEnv environments ship one."""

    def _step_payload(self, action: NumberGuessAction) -> dict:
        return {"guess": action.guess, "verbose": action.verbose}

    def _parse_result(self, payload: dict) -> StepResult[NumberGuessObservation]:
        observation = NumberGuessObservation(
            **payload.get("observation", {}),
            done=payload.get("done", False),
            reward=payload.get("reward"),
        )
        return StepResult(observation, payload.get("reward"), payload.get("done", False))

    def _parse_state(self, payload: dict) -> State:
        return State(**payload)


def make_app(max_sessions: int = 64):
    return create_app(
        NumberGuessEnvironment, NumberGuessAction, NumberGuessObservation,
        env_name="number_guess", max_concurrent_envs=max_sessions,
    )  # fmt: skip


if __name__ == "__main__":
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-sessions", type=int, default=64, help="concurrent episodes")
    args = parser.parse_args()
    uvicorn.run(make_app(args.max_sessions), host=args.host, port=args.port, log_level="warning")
