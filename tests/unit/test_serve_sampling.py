"""The service's model sampler answers requests sent together in one batched
generation (``ModelHost.sample_queued``): each request's sequences are the ones it
gets alone -- the same tokens from the same seeds, the same log-probs -- whatever
prompts, lengths and settings share its batch, and a bad request is answered with
its own error."""

from __future__ import annotations

from collections import deque

import pytest

from rlpost.models.tiny import build_tiny_model
from rlpost.serve.errors import UserError
from rlpost.serve.host import ModelHost
from rlpost.serve.sampling import SampleRequest
from rlpost.serve.wire import SampleParams


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sampling")
    path = build_tiny_model("micro", tmp / "m", seed=0, init_std=0.3)
    host = ModelHost("micro", str(path), tmp / "state")
    host.base_snapshot("base")
    return host


def requests(host) -> list[SampleRequest]:
    enc = lambda text: list(host.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    return [
        SampleRequest("base", enc("12+30="), 2, SampleParams(max_tokens=6, seed=1), False),
        SampleRequest("base", enc("What is 4 + 5? 9. What is 7 + 1?"), 3,
                      SampleParams(max_tokens=8, top_p=0.9, seed=2, temperature=0.7), True),
        SampleRequest("base", enc("1+1="), 1,
                      SampleParams(max_tokens=3, top_k=5, seed=3, stop_strings=("1",)), True),
        SampleRequest("base", enc("9+9="), 2, SampleParams(max_tokens=5, temperature=0.0), False),
    ]  # fmt: skip


def answer(host, batch: list[SampleRequest]) -> None:
    queue = deque(batch)
    host.sample_queued(queue)
    assert not queue


def test_requests_sent_together_get_what_each_gets_alone(host):
    alone = requests(host)
    for r in alone:
        answer(host, [r])
    together = requests(host)
    answer(host, together)
    for a, b in zip(alone, together, strict=True):
        (seqs_a, first_a), (seqs_b, first_b) = a.answer.result(), b.answer.result()
        assert len(seqs_a) == len(seqs_b) == a.n
        for x, y in zip(seqs_a, seqs_b, strict=True):
            assert x.tokens == y.tokens and x.stopped == y.stopped
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
        if a.prompt_logprobs:
            assert first_a[1:] == pytest.approx(first_b[1:], abs=1e-5)
            assert len(first_a) == len(a.prompt)
        else:
            assert first_a is None and first_b is None
    # each request's own limits: max_tokens, and the stop string ending the third
    seqs, _ = together[0].answer.result()
    assert all(len(s.tokens) <= 6 for s in seqs)
    third = together[2].answer.result()[0][0]
    assert third.stopped == ("1" in host.tokenizer.decode(third.tokens))
    greedy = together[3].answer.result()[0]
    assert greedy[0].tokens == greedy[1].tokens  # temperature 0: the same argmax path


def test_a_bad_request_is_answered_with_its_own_error(host):
    good = requests(host)[0]
    empty = SampleRequest("base", [], 1, SampleParams(max_tokens=2), False)
    answer(host, [empty, good])
    with pytest.raises(UserError, match="the prompt is empty"):
        empty.answer.result()
    assert len(good.answer.result()[0]) == 2
