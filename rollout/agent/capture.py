"""Trajectories from what an OpenAI-compatible endpoint recorded, by exact prefix matching.

Shapes: flat lists over a segment's response tokens (t); nothing here pads.

An agent program talks to the endpoint in calls. Each call records the prompt ids
the endpoint rendered and the ids (and log-probs) the engine sampled. Nothing is
ever re-tokenised: when a call's prompt ids start with the previous call's
prompt + sampled ids, the ids between them are environment tokens (mask 0) and
the call's sampled ids follow (mask 1), so the segment is one sequence in which
every token was scored in the context it was sampled in. When a prompt does not
extend the previous one (the agent edited or dropped history, or rendered it
differently), the trajectory splits there: a new segment starts with that call's
prompt. ``len(segments) - 1`` is the episode's number of prefix breaks.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Call:
    """One chat-completions call of a session."""

    prompt_ids: list[int]
    sampled_ids: list[int]  # what the agent saw (cut after a stop string, if one hit)
    logprobs: list[float]
    versions: list[int]  # policy version per sampled token (-1: not known)
    finish_reason: str  # the engine's: "stop" or "length"
    ended: bool  # the last sampled id is the end token
    text: str  # the sampled text the agent got, before tool-call parsing
    message: dict  # the assistant message returned, tool-call arguments as dicts
    request_messages: list[dict]  # the request's messages, normalised
    tool_calls: int = 0
    tool_errors: int = 0  # malformed tool-call blocks
    stop: str | None = None  # the request's stop string the text was cut at


@dataclass
class Segment:
    """One training sample: a prompt and the model/environment tokens after it."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1: sampled, 0: environment
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add(self, env_ids: list[int], call: Call) -> None:
        self.response_ids += env_ids + call.sampled_ids
        self.mask += [0] * len(env_ids) + [1] * len(call.sampled_ids)
        self.logprobs += [0.0] * len(env_ids) + list(call.logprobs)
        versions = call.versions or [-1] * len(call.sampled_ids)
        self.versions += [-1] * len(env_ids) + list(versions)
        self.calls.append(call)


def segments(calls: list[Call]) -> list[Segment]:
    """The calls of one session as segments, in order; at least one when there are calls.

    Call ``k`` continues the current segment when its prompt ids start with the
    segment's ids (prompt + everything after it so far) and are at least as long;
    the ids in between are environment tokens. Otherwise it opens a new segment.
    """
    out: list[Segment] = []
    for call in calls:
        if out:
            ids = out[-1].ids
            if call.prompt_ids[: len(ids)] == ids:
                out[-1].add(call.prompt_ids[len(ids) :], call)
                continue
        segment = Segment(prompt_ids=list(call.prompt_ids))
        segment.add([], call)
        out.append(segment)
    return out
