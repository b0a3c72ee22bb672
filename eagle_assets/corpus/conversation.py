"""Rebuild a training conversation with the target's own chat template: token ids and loss mask.

The server hands back each answer split in two by its reasoning parser: `content` and
`reasoning_content`. Training needs the tokens the target actually produces, so the
reasoning goes back into the target's thinking tokens before templating: if the chat
template renders `reasoning_content` itself (many reasoning templates do), it is passed
through (as `reasoning_content` and `reasoning`, the names vLLM gives templates); otherwise
it is wrapped as `<think>\\n...\\n</think>\\n` in front of the content
(`ThinkingFormat`, configurable per target).

The stored ids are, by contract (formats.py), exactly
`tokenizer.apply_chat_template(training_messages, tokenize=True)`, and the loss mask is 1 on
every assistant token, thinking and the end-of-turn token included, 0 elsewhere. Each
assistant turn's span is found by rendering the conversation up to that turn (with the
generation prompt), checking it is a prefix of the whole, and mapping characters to tokens;
tokenizers without offsets fall back to checking token prefixes.

Templates like Kimi's render no reasoning in a conversation (every history turn is
`<think></think>` and its answer) and open the thinking block in the generation prompt. Applied
to a conversation they would drop what the target wrote, so there the stored ids are the
conversation up to its last assistant turn rendered with the generation prompt, then that turn
as the target wrote it (reasoning, `</think>`, answer, end of turn), and only that turn is
trained on (`ChatTemplate.thinking_end`).

    from eagle_assets.corpus.conversation import ChatTemplate
    template = ChatTemplate(tokenizer)
    example = template.tokenize(messages)        # example.input_ids, example.loss_mask
    problem = template.find_mismatch(row)         # None when the row round-trips
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Sentinels that no real text contains: used to learn the template's layout.
_SENTINEL_USER = "\u2063EAGLE_ASSETS_USER_SENTINEL\u2063"
_SENTINEL_ANSWER = "\u2063EAGLE_ASSETS_ANSWER_SENTINEL\u2063"
_SENTINEL_REASONING = "\u2063EAGLE_ASSETS_REASONING_SENTINEL\u2063"


@dataclass(frozen=True)
class ThinkingFormat:
    """How reasoning is written back into an assistant turn when the template does not do it."""

    start: str = "<think>\n"
    """Text before the reasoning (the target's thinking-start token and what follows it)."""
    end: str = "\n</think>\n"
    """Text between the reasoning and the answer."""
    strip_newlines: bool = True
    """Strip newlines around the reasoning and before the answer, as reasoning templates do,
    so that `start`/`end` alone decide the whitespace."""

    def wrap(self, reasoning: str, content: str) -> str:
        if self.strip_newlines:
            reasoning, content = reasoning.strip("\n"), content.lstrip("\n")
        return f"{self.start}{reasoning}{self.end}{content}"


@dataclass(frozen=True)
class TokenizedConversation:
    """A conversation as the trainer sees it."""

    input_ids: list[int]
    """apply_chat_template(training messages, tokenize=True)."""
    loss_mask: list[int]
    """1 on assistant tokens (thinking and end-of-turn included), 0 elsewhere; len == len(input_ids)."""
    text: str
    """The rendered template text the ids were made from."""


class ConversationError(ValueError):
    """The chat template cannot produce a training example for this conversation."""


class TokenMismatchError(ValueError):
    """Stored token ids that are not what the chat template makes of the stored conversation."""


def _as_ids(encoded: Any) -> list[int]:
    ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
    return [int(i) for i in ids]


class ChatTemplate:
    """The target tokenizer's chat template, with what the corpus needs to know about it.

    Learns once, by rendering sentinel conversations: whether the template renders
    `reasoning_content` itself and which text closes an assistant turn.
    """

    def __init__(self, tokenizer: Any, thinking: ThinkingFormat | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ConversationError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template; "
                "the corpus is built with the target's own template. Use the target's tokenizer "
                "folder (it ships chat_template.jinja or tokenizer_config.json:chat_template)."
            )
        self.tokenizer = tokenizer
        self.thinking = thinking or ThinkingFormat()
        probe = [
            {"role": "user", "content": _SENTINEL_USER},
            {"role": "assistant", "content": _SENTINEL_ANSWER, "reasoning_content": _SENTINEL_REASONING, "reasoning": _SENTINEL_REASONING},
        ]
        text = self.render(probe)
        # True when the template renders the reasoning itself: passed through, not wrapped. It is
        # passed under both names, `reasoning_content` and `reasoning`, as vLLM hands it to templates.
        self.handles_reasoning: bool = _SENTINEL_REASONING in text
        # The token that closes an assistant turn (`<|im_end|>` for ChatML): the template's
        # first token after the answer, else the tokenizer's eos.
        tail = text[text.index(_SENTINEL_ANSWER) + len(_SENTINEL_ANSWER) :]
        tail_ids = _as_ids(tokenizer(tail, add_special_tokens=False)) if tail else []
        if tail_ids:
            self.end_of_turn: str = tokenizer.decode(tail_ids[:1])
        elif tokenizer.eos_token:
            self.end_of_turn = tokenizer.eos_token
        else:
            raise ConversationError(
                "the chat template writes nothing after an assistant message and the tokenizer "
                "has no eos token: cannot tell where an assistant turn ends"
            )
        self.end_of_turn_id: int = _as_ids(tokenizer(self.end_of_turn, add_special_tokens=False))[0]
        self.answer_tail: str = tail
        """What the template writes after an assistant answer (the end-of-turn token and whatever follows)."""
        # Templates that render no reasoning in a conversation and open the thinking block in the
        # generation prompt (Kimi's: history turns are `<think></think>` and the answer, the
        # generation prompt ends in `<think>`): the target then writes reasoning, the end of
        # thinking and its answer after the generation prompt, and a rendered conversation keeps
        # none of it. `thinking_end` is the text the template writes between its generation
        # prompt and a history answer (`</think>`), or None for other templates.
        self.thinking_end: str | None = None
        if not self.handles_reasoning:
            asked = self.render(probe[:1], add_generation_prompt=True)
            answered = self.render([probe[0], {"role": "assistant", "content": _SENTINEL_ANSWER}])
            between = answered[len(asked) : answered.index(_SENTINEL_ANSWER)] if answered.startswith(asked) else ""
            self.thinking_end = between if between.strip() else None

    def render(self, messages: Sequence[Mapping], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)

    def user_prefix(self, history: Sequence[Mapping] = ()) -> str:
        """Template text up to where the next user message starts (Magpie-style synthesis).

        `history` is the conversation so far (may start with a system message); for ChatML
        with no history this is the default system turn then `<|im_start|>user\\n`.
        """
        text = self.render([*history, {"role": "user", "content": _SENTINEL_USER}])
        return text[: text.index(_SENTINEL_USER)]

    def training_messages(self, messages: Sequence[Mapping]) -> list[dict]:
        """The conversation the template renders: reasoning passed through or wrapped; where the
        generation prompt opens thinking (`thinking_end`), left out: the template writes history
        turns' thinking itself (empty), and wrapped into the content it would be written twice."""
        out = []
        for i, m in enumerate(messages):
            role, content = m.get("role"), m.get("content")
            if not isinstance(content, str):
                raise ConversationError(f"message {i} ({role}) has no text content: {m!r}")
            reasoning = m.get("reasoning_content")
            if role != "assistant" or reasoning is None or self.thinking_end is not None:
                out.append({"role": role, "content": content})
            elif self.handles_reasoning:
                out.append({"role": role, "content": content, "reasoning_content": reasoning, "reasoning": reasoning})
            else:
                out.append({"role": role, "content": self.thinking.wrap(reasoning, content)})
        return out

    def tokenize(self, messages: Sequence[Mapping]) -> TokenizedConversation:
        """Token ids and loss mask of `messages` (raw: assistant turns carry `reasoning_content`)."""
        if self.thinking_end is not None:
            return self._tokenize_after_prompt(messages)
        train = self.training_messages(messages)
        text = self.render(train)
        spans = self._assistant_char_spans(train, text)
        try:
            enc = self.tokenizer.apply_chat_template(train, tokenize=True, return_dict=True, tokenizer_kwargs={"return_offsets_mapping": True})
            offsets = enc["offset_mapping"]
        except (NotImplementedError, KeyError, TypeError, ValueError):
            offsets = None  # a tokenizer without offsets (e.g. tiktoken-based): token prefixes
        if offsets is not None:
            ids = _as_ids(enc)
            mask = [0] * len(ids)
            # A token belongs to a turn when it starts inside the turn's text; a token that
            # merges the generation prompt's last newline with the answer stays a prompt token.
            for start, end in spans:
                for t, (a, _) in enumerate(offsets):
                    if start <= a < end:
                        mask[t] = 1
        else:
            ids = _as_ids(self.tokenizer.apply_chat_template(train, tokenize=True, return_dict=False))
            mask = self._mask_by_token_prefixes(train, ids)
        return TokenizedConversation(input_ids=ids, loss_mask=mask, text=text)

    def _tokenize_after_prompt(self, messages: Sequence[Mapping]) -> TokenizedConversation:
        """Where the generation prompt opens thinking: the conversation up to its last assistant
        turn as the template renders it with the generation prompt, then what the target wrote
        after it: its reasoning, `thinking_end`, its answer and the template's end of turn. The
        loss mask covers that last turn only: earlier assistant turns are history, rendered
        without their reasoning, which is not what the target wrote for them."""
        if not messages or messages[-1].get("role") != "assistant":
            raise ConversationError("the conversation does not end with an assistant turn: nothing to train on")
        train = self.training_messages(messages)
        last = messages[-1]
        prefix = self.render(train[:-1], add_generation_prompt=True)
        if self.end_of_turn in train[-1]["content"]:
            raise ConversationError(
                f"the last assistant turn contains the end-of-turn marker {self.end_of_turn!r} as text; "
                "the sample cannot be templated unambiguously, drop it"
            )
        reasoning = last.get("reasoning_content")
        thinking = f"{reasoning}{self.thinking_end}" if reasoning is not None else ""
        text = prefix + thinking + train[-1]["content"] + self.answer_tail
        ids = _as_ids(self.tokenizer(text, add_special_tokens=False))
        prefix_ids = _as_ids(self.tokenizer(prefix, add_special_tokens=False))
        if ids[: len(prefix_ids)] != prefix_ids:
            raise ConversationError(
                f"the generation prompt's tokens are not a token prefix of the whole turn ({describe_difference(prefix_ids, ids, self.tokenizer)})"
            )
        try:
            end = ids.index(self.end_of_turn_id, len(prefix_ids))
        except ValueError:
            raise ConversationError(f"the last assistant turn has no end-of-turn token {self.end_of_turn!r}") from None
        mask = [0] * len(prefix_ids) + [1] * (end + 1 - len(prefix_ids)) + [0] * (len(ids) - end - 1)
        return TokenizedConversation(input_ids=ids, loss_mask=mask, text=text)

    def _assistant_char_spans(self, train: list[dict], text: str) -> list[tuple[int, int]]:
        spans = []
        for i, m in enumerate(train):
            if m["role"] != "assistant":
                continue
            prefix = self.render(train[:i], add_generation_prompt=True)
            if not text.startswith(prefix):
                at = next((k for k, (a, b) in enumerate(zip(prefix, text)) if a != b), min(len(prefix), len(text)))
                raise ConversationError(
                    f"the chat template renders the conversation before assistant turn {i} "
                    f"differently from the whole conversation (first difference at character {at}: "
                    f"prefix {prefix[max(0, at - 40) : at + 40]!r} vs whole {text[max(0, at - 40) : at + 40]!r}); "
                    "its assistant tokens cannot be located"
                )
            if self.end_of_turn in m["content"]:
                raise ConversationError(
                    f"assistant turn {i} contains the end-of-turn marker {self.end_of_turn!r} as text; "
                    "the sample cannot be templated unambiguously, drop it"
                )
            end = text.find(self.end_of_turn, len(prefix))
            if end < 0:
                raise ConversationError(f"assistant turn {i} is not closed by {self.end_of_turn!r} in the rendered template")
            spans.append((len(prefix), end + len(self.end_of_turn)))
        return spans

    def _mask_by_token_prefixes(self, train: list[dict], ids: list[int]) -> list[int]:
        mask = [0] * len(ids)
        for i, m in enumerate(train):
            if m["role"] != "assistant":
                continue
            prefix = _as_ids(self.tokenizer.apply_chat_template(train[:i], tokenize=True, add_generation_prompt=True, return_dict=False))
            if ids[: len(prefix)] != prefix:
                raise ConversationError(
                    f"the tokens before assistant turn {i} are not a token prefix of the whole "
                    f"conversation ({describe_difference(prefix, ids, self.tokenizer)}); this tokenizer "
                    "has no offsets to fall back on"
                )
            try:
                end = ids.index(self.end_of_turn_id, len(prefix))
            except ValueError:
                raise ConversationError(f"assistant turn {i} has no end-of-turn token {self.end_of_turn!r}") from None
            mask[len(prefix) : end + 1] = [1] * (end + 1 - len(prefix))
        return mask

    def find_mismatch(self, row: Mapping) -> str | None:
        """None when the row's ids and mask are what the template makes of its messages; else why not."""
        sid = row.get("sample_id", "?")
        try:
            messages = json.loads(row["messages"]) if isinstance(row["messages"], str) else row["messages"]
            rebuilt = self.tokenize(messages)
        except (ConversationError, json.JSONDecodeError, KeyError) as exc:
            return f"sample {sid}: cannot rebuild the conversation: {exc}"
        stored = [int(i) for i in row["input_ids"]]
        if stored != rebuilt.input_ids:
            return (
                f"sample {sid}: stored input_ids differ from apply_chat_template of the rebuilt "
                f"conversation: {describe_difference(stored, rebuilt.input_ids, self.tokenizer, ('stored', 'rebuilt'))}"
            )
        mask = [int(v) for v in row["loss_mask"]]
        if mask != rebuilt.loss_mask:
            at = next((k for k, (a, b) in enumerate(zip(mask, rebuilt.loss_mask)) if a != b), min(len(mask), len(stored)))
            return (
                f"sample {sid}: stored loss_mask differs from the assistant spans at token {at} "
                f"({self.tokenizer.decode(stored[max(0, at - 8) : at + 8])!r}): stored "
                f"{mask[max(0, at - 8) : at + 8]} vs rebuilt {rebuilt.loss_mask[max(0, at - 8) : at + 8]}"
            )
        return None

    def verify(self, row: Mapping) -> None:
        """Raise `TokenMismatchError` saying what differs unless the row round-trips."""
        problem = self.find_mismatch(row)
        if problem:
            raise TokenMismatchError(problem)


def describe_difference(a: Sequence[int], b: Sequence[int], tokenizer: Any, names: tuple[str, str] = ("prefix", "whole"), context: int = 12) -> str:
    """Where two token sequences first differ, with the decoded text around it on both sides."""
    at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo = max(0, at - context)

    def show(ids: Sequence[int]) -> str:
        before = tokenizer.decode(list(ids[lo:at]))
        after = tokenizer.decode(list(ids[at : at + context]))
        return f"{before!r} | {after!r}"

    return (
        f"first differing token at index {at} ({names[0]} has {len(a)} tokens, {names[1]} {len(b)}); "
        f"{names[0]}: {show(a)}; {names[1]}: {show(b)} (| marks index {at})"
    )


def tokenize_conversation(messages: Sequence[Mapping], tokenizer: Any, thinking: ThinkingFormat | None = None) -> TokenizedConversation:
    """Token ids and loss mask of a raw conversation (see `ChatTemplate.tokenize`)."""
    return ChatTemplate(tokenizer, thinking).tokenize(messages)


def verify_token_ids(row: Mapping, tokenizer: Any, thinking: ThinkingFormat | None = None) -> str | None:
    """None when a corpus row's ids and mask round-trip through the chat template; else what differs."""
    return ChatTemplate(tokenizer, thinking).find_mismatch(row)
