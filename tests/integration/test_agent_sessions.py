"""Multi-turn agent episodes on two real vLLM-CPU replicas: with session ids every
turn of an episode reaches one replica (checked from what each replica received)
and later turns find their earlier turns cached; without session ids the router
balances load instead and the same episodes hit the prefix cache less.

The episodes move in lockstep: each environment answers turn k only once every
episode has finished turn k, then the episodes send their next request one at a
time, in an order rotated by one each turn. Every wave therefore starts with
nothing in flight, and least-in-flight routing (ties to the lower index) sends
position p of a wave to replica p % 2: without session ids an episode changes
replica on every turn, whatever the timing of the engines.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray")
pytest.importorskip("vllm")

from rollout_utils import two_replicas  # noqa: E402

from rlpost.rollout.agent.loop import AgentLoopConfig, Episode, engine_generate, run_episodes  # noqa: E402
from rlpost.rollout.base import SamplingConfig  # noqa: E402
from rlpost.workers.rollout_worker import prompt_hash  # noqa: E402

EPISODES = 8
TURNS = 4
# Seeded per episode and turn, so both runs sample the very same episodes.
SAMPLING = SamplingConfig(n=1, temperature=1.0, max_tokens=8, seed=3)
LOOP = AgentLoopConfig(max_turns=TURNS, max_response_tokens=200, max_model_len=256, parser=None)


class Lockstep:
    """Releases the episodes' turns in waves (see the module docstring)."""

    def __init__(self, episodes: int):
        self.n = episodes
        self.waves: dict[int, dict[int, asyncio.Event]] = {}

    async def wait(self, episode: int, wave: int) -> None:
        events = self.waves.setdefault(wave, {})
        events[episode] = asyncio.Event()
        order = [(p - wave) % self.n for p in range(self.n)]  # episode e at position e + wave
        if len(events) == self.n:
            events[order[0]].set()
        await events[episode].wait()
        # The loop sends this episode's request before it next yields, so the
        # next episode in the order runs only after that request is in flight.
        position = order.index(episode)
        if position + 1 < self.n:
            events[order[position + 1]].set()


class LockstepReplies:
    """Answers each assistant turn with a 24-character user message; done after TURNS."""

    def __init__(self, lockstep: Lockstep):
        self.lockstep, self.episode, self.seen = lockstep, 0, 0

    async def reset(self, row: dict) -> list[dict]:
        self.episode, self.seen = row["id"], 0
        await self.lockstep.wait(self.episode, 0)
        return [{"role": "user", "content": f"Episode {row['id']}: keep a log of each turn."}]

    async def step(self, message: dict) -> tuple[list[dict], bool, float | None]:
        self.seen += 1
        if self.seen >= TURNS:
            return [], True, None
        await self.lockstep.wait(self.episode, self.seen)
        return [{"role": "user", "content": f"turn {self.seen} done; next step, go"}], False, None


def turn_prompts(episode: Episode) -> list[list[int]]:
    """Each model turn's prompt: the previous prompt + its sampled ids + environment ids."""
    ids, prompts = list(episode.prompt_ids), []
    for turn in episode.turns:
        prompts.append(list(ids))
        ids += turn.sampled_ids + turn.env_ids
    return prompts


def run(group, tokenizer, with_sessions: bool) -> tuple[list[Episode], list[list], float]:
    """All episodes once; returns them, what each replica received, and the hit rate."""
    group.reset_prefix_cache()
    group.stats()  # the hit rate counts from here
    before = [len(log) for log in group.served()]
    lockstep = Lockstep(EPISODES)
    with_id = engine_generate(group)

    async def without_id(prompt_ids, sampling, session_id):
        return await with_id(prompt_ids, sampling, None)

    episodes = asyncio.run(
        run_episodes(
            [{"id": i} for i in range(EPISODES)], 1,
            generate=with_id if with_sessions else without_id, tokenizer=tokenizer,
            make_env=lambda: LockstepReplies(lockstep), sampling=SAMPLING, config=LOOP,
            session_prefix="ep",
        )
    )  # fmt: skip
    rate = group.stats()["rollout/prefix_cache_hit_rate"]
    served = [log[n:] for log, n in zip(group.served(), before)]
    return episodes, served, rate


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    with two_replicas(tmp_path_factory.mktemp("m")) as group_path_tokenizer:
        yield group_path_tokenizer


def test_sessions_keep_episodes_on_one_replica_and_hit_the_cache(setup):
    group, _, tokenizer = setup
    episodes, served, with_rate = run(group, tokenizer, with_sessions=True)
    # Every episode ran its turns (the environment ends it after TURNS); its turns
    # are cut at 8 tokens on purpose, so one ending on a cut turn counts as truncated.
    assert all(e.num_turns == TURNS for e in episodes)

    # Every turn of an episode reached one replica, in order; both replicas had episodes.
    homes = set()
    for e in episodes:
        where = [i for i, log in enumerate(served) for sid, _ in log if sid == e.session_id]
        assert len(where) == TURNS and len(set(where)) == 1, (e.session_id, where)
        homes.add(where[0])
        sent = [prompt_hash(p) for p in turn_prompts(e)]
        assert [h for sid, h in served[where[0]] if sid == e.session_id] == sent
    assert homes == {0, 1}

    same, served_none, without_rate = run(group, tokenizer, with_sessions=False)
    # Seeded turns: the second run sampled exactly the same episodes.
    assert [e.response_ids for e in same] == [e.response_ids for e in episodes]
    # Without session ids, each follow-up turn went to the other replica than the
    # turn before it (least in flight over the rotated waves).
    replica_of = {h: i for i, log in enumerate(served_none) for sid, h in log if sid is None}
    for e in same:
        path = [replica_of[prompt_hash(p)] for p in turn_prompts(e)]
        assert all(a != b for a, b in zip(path, path[1:])), (e.session_id, path)

    # Prompts per episode: 38 tokens, then + 8 sampled + 30 environment tokens a turn:
    # 38 + 76 + 114 + 152 = 380 looked up. Whole 32-token blocks are cached, of the
    # sequences before (prompt + sampled: 46, 84, 122 tokens -> 1, 2, 3 blocks).
    # With sessions turn k finds turn k-1's: 32 + 64 + 96 = 192 -> 192 / 380 = 0.505.
    # Without, its replica last held turn k-2: 0 + 32 + 64 = 96 -> 96 / 380 = 0.253.
    # (A turn that samples the end token early is a few tokens shorter: the seeded
    # samples here shift no block boundary, only the 380 by a few tokens.)
    print(f"prefix-cache hit rate: with sessions {with_rate:.3f}, without {without_rate:.3f}")
    assert with_rate == pytest.approx(192 / 380, abs=0.02)
    assert without_rate == pytest.approx(96 / 380, abs=0.02)
