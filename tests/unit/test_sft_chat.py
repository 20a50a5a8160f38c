"""Supervised targets from multi-turn chats: loss only on what the assistant says."""

from rlpost.data.samples import conversation_tokens, sft_batch
from rlpost.models.tiny import build_tokenizer
from rlpost.plan.inputs import sft_row

CHAT = [
    {"role": "user", "content": "1+1="},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "2+2="},
    {"role": "assistant", "content": "4"},
]


def test_assistant_turns_are_the_only_targets():
    tok = build_tokenizer()
    ids, mask = conversation_tokens(tok, CHAT)
    # The whole conversation, exactly as the chat template renders it.
    assert (
        tok.decode(ids)
        == "<|user|>1+1=<|end|><|assistant|>2<|end|><|user|>2+2=<|end|><|assistant|>4<|end|>"
    )
    targets = tok.decode([t for t, m in zip(ids, mask) if m])
    # "2" + end and "4" + end: the assistant headers and user turns carry no loss.
    assert targets == "2<|end|>4<|end|>"
    assert sum(mask) == 4


def test_chat_rows_and_prompt_response_rows_in_one_batch():
    tok = build_tokenizer()
    batch = sft_batch(tok, [{"messages": CHAT}, {"prompt": "3+4=", "response": "7"}])
    second = batch.input_ids_bt[1][batch.response_mask_bt[1].bool()].tolist()
    assert tok.decode(second) == "7<|end|>"
    assert int(batch.response_mask_bt[0].sum()) == 4


def test_chat_row_gets_a_prompt_for_validation():
    row = sft_row({"messages": CHAT})
    # validation continues the conversation before the last assistant turn
    assert row["prompt"] == CHAT[:3]
    assert row["answer"] == "4"
