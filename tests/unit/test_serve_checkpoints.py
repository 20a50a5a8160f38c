"""The service's checkpoint folders: a ``tinker://`` path reads only what the same
key wrote, only under the state directory; and a sample request's JSON parsed."""

from __future__ import annotations

import json

import pytest

from rlpost.serve.checkpoints import Checkpoints
from rlpost.serve.errors import NotFound, UserError
from rlpost.serve.wire import SampleParams, prompt_tokens, sample_params

RUN = "s0123456789abcdef:train:0"


def _written(store: Checkpoints, kind: str, name: str, owner: str) -> str:
    where = store.folder(RUN, kind, name)
    where.mkdir(parents=True)
    meta = {"owner": owner, "base_model": "m", "lora": {"rank": 4, "train_unembed": False,
            "train_mlp": True, "train_attn": True}}  # fmt: skip
    (where / "meta.json").write_text(json.dumps(meta))
    (where / "adapter.safetensors").write_bytes(b"x" * 10)
    return f"tinker://{RUN}/{kind}/{name}"


def test_a_path_reads_what_its_key_wrote_and_nothing_else(tmp_path):
    store = Checkpoints(tmp_path)
    path = _written(store, "weights", "step-1", owner="alice")
    kind, where = store.readable(path, "alice")
    assert kind == "weights"
    assert where == tmp_path / "runs" / "s0123456789abcdef_train_0" / "weights" / "step-1"
    # another key, a name never written and a model id not the service's own: all NotFound
    for bad, owner in ((path, "bob"), (path.replace("step-1", "step-2"), "alice"),
                       ("tinker://x:train:0/weights/step-1", "alice")):  # fmt: skip
        with pytest.raises(NotFound):
            store.readable(bad, owner)
    # nothing outside the state directory: no path separators or dot-names in a name
    for bad in (f"tinker://{RUN}/weights/..", f"tinker://{RUN}/weights/.hidden"):
        with pytest.raises(UserError, match="letters, digits"):
            store.readable(bad, "alice")
    for bad in ("/etc/passwd", f"tinker://{RUN}/weights/a/../../b", f"tinker://{RUN}/other/a"):
        with pytest.raises(UserError, match="not a checkpoint path"):
            store.readable(bad, "alice")


def test_listing_newest_metadata_info_and_delete(tmp_path):
    store = Checkpoints(tmp_path)
    weights = _written(store, "weights", "a", owner="alice")
    _written(store, "sampler_weights", "b", owner="alice")
    listed = store.listing(RUN)
    assert [(c["checkpoint_id"], c["checkpoint_type"], c["size_bytes"]) for c in listed] == [
        (
            "weights/a",
            "training",
            10 + len((store.folder(RUN, "weights", "a") / "meta.json").read_bytes()),
        ),  # fmt: skip
        ("sampler_weights/b", "sampler", listed[1]["size_bytes"]),
    ]
    assert listed[0]["tinker_path"] == weights
    assert store.newest_meta(RUN, "alice")["base_model"] == "m"
    assert store.newest_meta(RUN, "bob") is None and store.newest_meta("nope", "alice") is None
    assert Checkpoints.info(store.readable(weights, "alice")[1])["lora_rank"] == 4
    with pytest.raises(NotFound):
        store.delete(weights, "bob")
    store.delete(weights, "alice")
    assert [c["checkpoint_id"] for c in store.listing(RUN)] == ["sampler_weights/b"]


def test_a_sample_requests_prompt_and_parameters():
    chunks = {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}, {"tokens": [3]}]}
    assert prompt_tokens(chunks) == [1, 2, 3]
    with pytest.raises(UserError, match="of type 'image'"):
        prompt_tokens({"chunks": [{"type": "image", "data": ""}]})
    with pytest.raises(UserError, match="list of integers"):
        prompt_tokens({"chunks": [{"tokens": ["a"]}]})
    assert sample_params({"stop": "\n", "seed": -1, "temperature": 0.5}, 64) == SampleParams(
        max_tokens=64, temperature=0.5, stop_strings=("\n",), seed=(-1) % (1 << 62)
    )
    assert sample_params({"stop": [7, 8], "max_tokens": 5}, 64).stop_tokens == (7, 8)
    with pytest.raises(UserError, match="stop must be"):
        sample_params({"stop": [1, "a"]}, 64)
    with pytest.raises(UserError, match="max_tokens=0"):
        sample_params({"max_tokens": 0}, 64)
