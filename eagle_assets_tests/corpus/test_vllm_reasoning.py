"""vLLM's real reasoning parsers + our conversation rebuild = the tokens the target wrote.

The SmolLM2 tokenizer gains `<think>`/`</think>` as special tokens and a ChatML-with-think
chat template, and is saved as a folder that both vLLM (in the engine environment) and our
code load. vLLM's DeepSeek-R1 and Qwen3 parsers split raw model outputs; our rebuild must
put the pieces back so that the assistant tokens are exactly the raw output, the corpus
token-id check passes, and a mis-wrapped conversation fails, saying what differs.
"""

from __future__ import annotations

import copy
import json

import pytest

from eagle_assets.corpus.conversation import ChatTemplate, ThinkingFormat
from eagle_assets.engines.vllm_reasoning import parse_with_vllm

pytestmark = pytest.mark.engine

# ChatML with thinking: the reasoning is rendered by the template itself, Qwen3 style.
CHATML_THINK = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content is defined and m.reasoning_content is not none %}"
    "<think>\n{{ m.reasoning_content.strip('\\n') }}\n</think>\n\n{{ m.content.lstrip('\\n') }}"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same layout, for a template that ignores reasoning_content: our wrap supplies it.
QWEN_STYLE_WRAP = ThinkingFormat(start="<think>\n", end="\n</think>\n\n")

RAW_OUTPUTS = [
    "<think>\nThe user asks for 2+2. Adding gives 4.\n</think>\n\nThe answer is 4.",
    "<think>\nStep one: read.\n\nStep two: answer.\n</think>\n\nDone: **yes**, it works.",
    "Started thinking in the prompt.\n</think>\n\nNo start token in the output.",  # Qwen3 with the think opened by the template
]


@pytest.fixture(scope="module")
def think_tokenizer_dir(tokenizer, tmp_path_factory):
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    tok.chat_template = CHATML_THINK
    folder = tmp_path_factory.mktemp("think-tokenizer")
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def parsed(engine_python, think_tokenizer_dir):
    return parse_with_vllm(str(engine_python), str(think_tokenizer_dir), ["deepseek_r1", "qwen3"], RAW_OUTPUTS)


def canonical(raw: str) -> str:
    return raw if raw.startswith("<think>") else "<think>\n" + raw


def test_vllm_parsers_split_and_our_rebuild_restores_the_raw_output(parsed, think_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(think_tokenizer_dir)
    template = ChatTemplate(tok)
    assert template.handles_reasoning
    plain = copy.copy(tok)
    plain.chat_template = tok.chat_template.replace("m.reasoning_content is defined", "false")
    wrapped = ChatTemplate(plain, QWEN_STYLE_WRAP)
    assert not wrapped.handles_reasoning

    for parser, results in parsed.items():
        assert len(results) == len(RAW_OUTPUTS)
        for raw, split in zip(RAW_OUTPUTS, results):
            assert split["reasoning"] and split["content"], (parser, raw, split)
            messages = [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": split["content"], "reasoning_content": split["reasoning"]},
            ]
            example = template.tokenize(messages)
            masked = [i for i, m in zip(example.input_ids, example.loss_mask) if m]
            # The assistant tokens are the target's own output, thinking tokens included.
            assert masked == tok(canonical(raw) + "<|im_end|>", add_special_tokens=False)["input_ids"], (parser, raw)
            assert tok.convert_tokens_to_ids("<think>") in masked
            row = {
                "sample_id": f"{parser}-{raw[:8]}",
                "messages": json.dumps(messages),
                "input_ids": example.input_ids,
                "loss_mask": example.loss_mask,
            }
            assert template.find_mismatch(row) is None
            # A template without reasoning support plus our wrap gives the very same ids.
            assert wrapped.tokenize(messages).input_ids == example.input_ids


def test_a_mis_wrapped_conversation_fails_saying_what_differs(parsed, think_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(think_tokenizer_dir)
    template = ChatTemplate(tok)
    split = parsed["deepseek_r1"][0]
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": split["content"], "reasoning_content": split["reasoning"]},
    ]
    # Stored ids made by wrapping with one newline after </think> where the template puts two.
    plain = copy.copy(tok)
    plain.chat_template = tok.chat_template.replace("m.reasoning_content is defined", "false")
    mis = ChatTemplate(plain, ThinkingFormat(start="<think>\n", end="\n</think>\n")).tokenize(messages)
    row = {"sample_id": "miswrapped", "messages": json.dumps(messages), "input_ids": mis.input_ids, "loss_mask": mis.loss_mask}
    message = template.find_mismatch(row)
    good = template.tokenize(messages).input_ids
    first = next(k for k, (a, b) in enumerate(zip(mis.input_ids, good)) if a != b)
    assert message.startswith("sample miswrapped: stored input_ids differ from apply_chat_template")
    assert f"first differing token at index {first}" in message
    # Both sides are shown decoded around the difference: the newline count after </think>.
    assert "</think>\\n' | 'The answer" in message and "</think>\\n' | '\\nThe answer" in message
