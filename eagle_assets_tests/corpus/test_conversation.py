"""Conversation rebuild with SmolLM2's real tokenizer: ids, loss mask, reasoning, round trip."""

from __future__ import annotations

import copy
import json

import pytest

from eagle_assets.corpus.conversation import (
    ChatTemplate,
    ConversationError,
    ThinkingFormat,
    TokenMismatchError,
    verify_token_ids,
)

# ChatML whose assistant turns render `reasoning_content` themselves, the way reasoning
# templates do (Qwen3 style: stripped reasoning, blank line before the answer).
REASONING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content %}<think>\n{{ m.reasoning_content.strip('\\n') }}\n</think>\n\n{% endif %}"
    "{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CONVERSATION = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4.", "reasoning_content": "Two plus two.\n"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "\n\n  It is 6."},  # leading whitespace merges with the header's newline
]


def spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The maximal runs of masked tokens."""
    out, run = [], []
    for i, m in zip(ids, mask):
        if m:
            run.append(i)
        elif run:
            out.append(run)
            run = []
    return out + ([run] if run else [])


def test_ids_are_apply_chat_template_and_mask_covers_exactly_the_answers(tokenizer, template):
    example = template.tokenize(CONVERSATION)
    train = template.training_messages(CONVERSATION)
    expected = tokenizer.apply_chat_template(train, tokenize=True, return_dict=False)
    assert example.input_ids == list(expected)
    assert len(example.loss_mask) == len(example.input_ids)

    answers = [tokenizer.decode(run) for run in spans(example.input_ids, example.loss_mask)]
    # SmolLM2's template does not render reasoning: it is wrapped in <think> before the answer.
    # The header's newline and the answer's first newline merge into one token ("\n\n"), which
    # starts in the header and so stays unmasked; the answer's tokens are all masked.
    assert answers == ["<think>\nTwo plus two.\n</think>\nIt is 4.<|im_end|>", "\n  It is 6.<|im_end|>"]
    # Everything else (system, user turns, assistant headers, newlines after <|im_end|>) is 0.
    unmasked = tokenizer.decode([i for i, m in zip(example.input_ids, example.loss_mask) if not m])
    assert "What is 2+2?" in unmasked and "And 3+3?" in unmasked and "It is" not in unmasked


def test_template_that_renders_reasoning_gets_it_passed_through(tokenizer):
    tok = copy.copy(tokenizer)
    tok.chat_template = REASONING_TEMPLATE
    template = ChatTemplate(tok)
    assert template.handles_reasoning
    example = template.tokenize(CONVERSATION[:2])
    assert example.text.count("<think>") == 1  # not wrapped twice
    assert [tok.decode(r) for r in spans(example.input_ids, example.loss_mask)] == ["<think>\nTwo plus two.\n</think>\n\nIt is 4.<|im_end|>"]
    assert not ChatTemplate(tokenizer).handles_reasoning


def test_user_prefix_is_the_template_up_to_the_user_message(template):
    assert template.user_prefix() == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n"
    )
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    assert template.user_prefix(history) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n"
    )
    assert (template.end_of_turn, template.end_of_turn_id) == ("<|im_end|>", 2)


def row_for(template: ChatTemplate, messages: list[dict]) -> dict:
    example = template.tokenize(messages)
    return {"sample_id": "s1", "messages": json.dumps(messages), "input_ids": example.input_ids, "loss_mask": example.loss_mask}


def test_round_trip_passes_and_a_mis_wrapped_row_says_what_differs(tokenizer, template):
    row = row_for(template, CONVERSATION)
    assert verify_token_ids(row, tokenizer) is None
    template.verify(row)

    # Ids made with other thinking tokens: the check names the index and both texts.
    wrong = ChatTemplate(tokenizer, ThinkingFormat(start="<reasoning>", end="</reasoning>"))
    bad = {**row, "input_ids": wrong.tokenize(CONVERSATION).input_ids}
    message = verify_token_ids(bad, tokenizer)
    stored = bad["input_ids"]
    first = next(k for k, (a, b) in enumerate(zip(stored, row["input_ids"])) if a != b)
    assert f"first differing token at index {first}" in message
    assert "reasoning>" in message and "think>" in message
    with pytest.raises(TokenMismatchError, match="sample s1: stored input_ids differ"):
        template.verify(bad)

    # Right ids, wrong mask (the user turn marked as a target).
    mask = list(row["loss_mask"])
    mask[25] = 1 - mask[25]
    assert "stored loss_mask differs from the assistant spans at token 25" in template.find_mismatch({**row, "loss_mask": mask})


def test_token_prefix_fallback_agrees_with_offsets(template):
    # Tokenizers without offsets (tiktoken-based targets) use token prefixes; where both work they agree.
    messages = CONVERSATION[:3] + [{"role": "assistant", "content": "It is 6."}]
    example = template.tokenize(messages)
    assert template._mask_by_token_prefixes(template.training_messages(messages), example.input_ids) == example.loss_mask


def test_answer_containing_the_end_of_turn_marker_is_refused(template):
    with pytest.raises(ConversationError, match="contains the end-of-turn marker '<\\|im_end\\|>'"):
        template.tokenize([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a<|im_end|>b"}])


def test_tokenizer_without_chat_template_is_refused(tokenizer):
    tok = copy.copy(tokenizer)
    tok.chat_template = None
    with pytest.raises(ConversationError, match="has no chat template"):
        ChatTemplate(tok)
