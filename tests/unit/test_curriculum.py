"""``data.curriculum``: the memory, the skipping, the return rate and resume, by hand."""

from __future__ import annotations

import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.data.curriculum import Curriculum
from rlpost.data.rows import PromptStream


def _rows(n: int) -> list[dict]:
    return [{"prompt": f"p{i}", "answer": str(i)} for i in range(n)]


def test_a_prompt_is_settled_when_its_last_window_groups_all_agreed():
    c = Curriculum("pool", window=2, return_rate=0.0, seed=0)
    c.record(3, [1.0, 1.0, 1.0, 1.0])  # all solved
    assert not c.settled(3)  # one group of the two the window needs
    c.record(3, [0.0, 0.0, 0.0, 0.0])  # all failed: settled too
    assert c.settled(3)
    c.record(3, [1.0, 0.0, 1.0, 1.0])  # a group that disagrees: learnable again
    assert not c.settled(3)
    c.record(3, [1.0, 1.0, 1.0, 1.0])
    assert not c.settled(3)  # window [disagree, agree]
    assert c.admit(3, epoch=0, position=0)  # not settled: admitted, not counted
    assert (c.skipped, c.returned) == (0, 0)


def test_the_return_rate_brings_settled_prompts_back_at_its_rate():
    c = Curriculum("pool", window=1, return_rate=0.25, seed=7)
    c.record(0, [1.0, 1.0])
    admitted = sum(c.admit(0, epoch=0, position=p) for p in range(4000))
    assert abs(admitted / 4000 - 0.25) < 0.03  # 1000 expected, sd ~27
    assert (c.returned, c.skipped) == (admitted, 4000 - admitted)

    # the same (seed, epoch, position): the same decision, whatever came before
    def decisions(order):
        d = Curriculum("pool", window=1, return_rate=0.25, seed=7)
        d.record(0, [1.0, 1.0])
        return {p: d.admit(0, epoch=0, position=p) for p in order}

    forward, backward = decisions(range(50)), decisions(reversed(range(50)))
    assert forward == backward and 0 < sum(forward.values()) < 50


def test_the_stream_skips_settled_prompts_and_records_only_its_own_rows():
    c = Curriculum("pool", window=1, return_rate=0.0, seed=0)
    s = PromptStream(_rows(6), seed=0, batch_size=3, curriculum=c)
    first = s.next_batch()
    for row in first:  # every prompt of the first batch scored all alike
        s.record(row, [0.0, 0.0])
    s.record({"prompt": "p0", "answer": "0"}, [0.0, 0.0])  # an equal row, not the stream's own
    assert len(c.memory) == 3
    second = s.next_batch()
    assert not {r["prompt"] for r in second} & {r["prompt"] for r in first}
    # epoch 1: the three settled prompts are passed over, the other three make the batch
    third = s.next_batch()
    assert {r["prompt"] for r in third} == {r["prompt"] for r in second}
    assert c.skipped == 3 and s.epoch == 1
    assert c.metrics() == {"data/curriculum_settled_rows": 3.0, "data/curriculum_skipped": 3.0,
                           "data/curriculum_returned": 0.0}  # fmt: skip


def test_when_every_prompt_is_settled_the_stream_still_gives_batches():
    c = Curriculum("pool", window=1, return_rate=0.0, seed=0)
    s = PromptStream(_rows(4), seed=0, batch_size=2, curriculum=c)
    for row in s.rows:
        s.record(row, [1.0, 1.0])
    assert len(s.next_batch()) == 2  # after passing each prompt once, it takes them


def test_a_resumed_stream_admits_exactly_what_an_uninterrupted_one_does():
    def scored(stream: PromptStream, steps: int) -> list[list[str]]:
        out = []
        for _ in range(steps):
            batch = stream.next_batch()
            for row in batch:  # prompts with an even answer always agree
                stream.record(row, [1.0, 1.0] if int(row["answer"]) % 2 == 0 else [0.0, 1.0])
            out.append([r["prompt"] for r in batch])
        return out

    def stream() -> PromptStream:
        return PromptStream(_rows(10), seed=3, batch_size=4,
                            curriculum=Curriculum("pool", 2, 0.3, seed=3))  # fmt: skip

    straight = scored(stream(), 12)
    a = stream()
    head = scored(a, 5)
    state = a.state_dict()
    b = stream()
    b.load_state_dict(state)
    assert head + scored(b, 7) == straight
    whole = stream()
    scored(whole, 12)
    assert b.curriculum.state_dict() == whole.curriculum.state_dict()  # memory and counts
    # the even prompts came back only at the return rate once settled
    late = [p for batch in straight[6:] for p in batch]
    evens = sum(int(p[1:]) % 2 == 0 for p in late)
    assert evens < len(late) / 2


def test_config_refuses_the_curriculum_where_it_would_be_ignored():
    with pytest.raises(ConfigError) as e:
        compose(["algo=dpo", "data=arith_pref", "data.curriculum=pool"])
    assert "data.curriculum=pool: algo=dpo trains on fixed rows" in str(e.value)
    with pytest.raises(ConfigError) as e:
        compose(["algo=grpo", "data.curriculum_window=3"])
    assert "data.curriculum_window=3: shapes the curriculum, which is off" in str(e.value)
    cfg = compose(["algo=grpo", "data.curriculum=gate", "data.curriculum_return=0.2"])
    assert (cfg.data.curriculum, cfg.data.curriculum_return) == ("gate", 0.2)
