"""The agent endpoint's sessions: one per episode, its random API key *is* the
session, holding the episode's calls, the run's sampling and the episode's limits
(``SessionRegistry`` is thread-safe: programs open and close sessions on their own
loops, the server reads them on its own)."""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field

from rlpost.rollout.agent.capture import Call
from rlpost.rollout.agent.loop import AgentLoopConfig
from rlpost.rollout.agent.openai_responses import ResponseStore
from rlpost.rollout.base import SamplingConfig


@dataclass
class Session:
    """One episode's calls, with the sampling and limits of the run that opened it."""

    key: str
    session_id: str  # routing id: one replica serves all its calls
    index: int  # the episode's index, for per-call seeds
    sampling: SamplingConfig  # the run's (temperature, top_p, seed)
    limits: AgentLoopConfig
    calls: list[Call] = field(default_factory=list)
    truncated: bool = False  # a call hit the budget
    sampling_overridden: int = 0  # requests whose temperature / top_p / seed were ignored
    refused: int = 0  # requests refused with a 4xx error (a parameter the endpoint cannot serve)
    segment_start: int = 0  # prompt length of the current segment's first call
    responses: ResponseStore = field(default_factory=ResponseStore)  # for previous_response_id


class SessionRegistry:
    """Open sessions by API key; thread-safe (programs open and close sessions on their
    own loops, the server reads them on its own)."""

    def __init__(self) -> None:
        self._open: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(
        self, session_id: str, index: int, sampling: SamplingConfig, limits: AgentLoopConfig
    ) -> Session:
        session = Session("rlp-" + secrets.token_urlsafe(24), session_id, index, sampling, limits)
        with self._lock:
            self._open[session.key] = session
        return session

    def get(self, key: str) -> Session | None:
        with self._lock:
            return self._open.get(key)

    def close(self, key: str) -> Session | None:
        """End a session: its key is refused from now on."""
        with self._lock:
            return self._open.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)
