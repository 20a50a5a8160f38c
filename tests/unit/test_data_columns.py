"""Data as people have it: saved datasets, parquet shards, column maps, templates."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpost.config.compose import compose
from rlpost.config.schema import ConfigError
from rlpost.data.columns import fill_template, shape_rows, template_fields
from rlpost.data.rows import DataError, expand_paths, load_rows
from rlpost.plan.inputs import load_data

GSM = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "Half of 10?", "answer": "10 / 2 = 5\n#### 5"},
]


def test_template_fields_and_literal_braces():
    template = "{question} Put it in \\boxed{} or {{x}}; {question} again"
    assert template_fields(template) == ["question"]
    assert (
        fill_template(template, {"question": "1+1?"})
        == "1+1? Put it in \\boxed{} or {x}; 1+1? again"
    )


def test_shape_rows_maps_keys_template_and_system_prompt():
    data = compose(
        ["data=files", "data.train_files=[t]", "data.val_files=[v]",
         "data.prompt_template=Q: {question}", "data.answer_key=answer",
         "data.system_prompt=Think first."]
    ).data  # fmt: skip
    [row, _] = shape_rows(GSM, data, "gsm.parquet")
    assert row["prompt"] == [
        {"role": "system", "content": "Think first."},
        {"role": "user", "content": "Q: Tom has 3 apples and buys 4. How many?"},
    ]
    assert row["question"] == GSM[0]["question"]  # the original columns stay
    keyed = compose(
        ["data=files", "data.train_files=[t]", "data.val_files=[v]",
         "data.prompt_key=question", "data.answer_key=solution"]
    ).data  # fmt: skip
    with pytest.raises(DataError) as info:
        shape_rows(GSM, keyed, "gsm.parquet")
    message = str(info.value)
    assert "data.answer_key: gsm.parquet: 2 of 2 rows have no column 'solution'" in message
    assert "['answer', 'question']" in message


def test_saved_datasets_and_globs_load(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(GSM).save_to_disk(str(tmp_path / "gsm"))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(GSM), "test": datasets.Dataset.from_list(GSM[:1])}
    ).save_to_disk(str(tmp_path / "splits"))
    assert load_rows(tmp_path / "gsm") == GSM
    assert load_rows(tmp_path / "splits" / "test") == GSM[:1]
    with pytest.raises(DataError, match=r"several splits \(train, test\); name one"):
        load_rows(tmp_path / "splits")
    with pytest.raises(DataError, match="without state.json"):
        load_rows(tmp_path)
    for i, row in enumerate(GSM):
        pq.write_table(pa.Table.from_pylist([row]), tmp_path / f"train-{i:05d}.parquet")
    assert expand_paths([str(tmp_path / "train-*.parquet")]) == [
        tmp_path / "train-00000.parquet",
        tmp_path / "train-00001.parquet",
    ]
    with pytest.raises(DataError, match="matches no file"):
        expand_paths([str(tmp_path / "nothing-*.parquet")])


def test_the_plan_reads_a_saved_folder_with_a_template(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(GSM).save_to_disk(str(tmp_path / "gsm"))
    cfg = compose(
        ["data=files", f"data.train_files=[{tmp_path}/gsm]", f"data.val_files=[{tmp_path}/gsm]",
         "data.prompt_template={question} Answer after ####."]
    )  # fmt: skip
    train, val, bad = load_data(cfg)
    assert train[1]["prompt"] == "Half of 10? Answer after ####." and bad == 0 and len(val) == 2
    missing = compose(
        ["data=files", f"data.train_files=[{tmp_path}/gsm]", f"data.val_files=[{tmp_path}/gsm]",
         "data.prompt_template={problem}"]
    )  # fmt: skip
    with pytest.raises(DataError, match="data.prompt_template: .* no column 'problem'"):
        load_data(missing)


def test_shaping_keys_need_data_files():
    with pytest.raises(ConfigError, match="data.prompt_key: shapes the rows of data files"):
        compose(["data.prompt_key=question"])
