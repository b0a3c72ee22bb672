"""The Kimi-K2.5 stand-in's tokenizer, built the way the hub's is.

Kimi-K2.5's tokenizer is remote code: a slow `PreTrainedTokenizer` subclass, `TikTokenTokenizer`
in `tokenization_kimi.py`, that reads byte-pair ranks from `tiktoken.model` with tiktoken and
puts 256 reserved special tokens after them, the chat and thinking tokens among them (on the
hub `[BOS]` is rank count + 0, `<|im_end|>` + 2, `<|im_middle|>` + 17, `<think>` + 22 and
`</think>` + 23). No `tokenizer.json` ships with it, so transformers cannot load it without the
remote code. The stand-in does the same at SmolLM2's size:

  * `tiktoken.model`: SmolLM2's byte-level BPE vocabulary as tiktoken ranks (its merges are in id
    order, so ranks in that order merge as SmolLM2 does), the single bytes SmolLM2 lacks first;
  * `tokenization_kimi.py`: a class of this module's own writing with the hub's imports, in two
    revisions: "old" imports `bytes_to_unicode` from `transformers.models.gpt2.tokenization_gpt2`
    (removed in transformers 5), "new" from `transformers.convert_slow_tokenizer`;
  * `tokenizer_config.json` with `auto_map` and the 256 special tokens; `chat_template.jinja`
    rendering thinking as the hub's template does: history assistant turns as `<think></think>`
    and their answer, and the generation prompt ending in `<think>` (thinking on) or
    `<think></think>` (`thinking=False`).

The DeepSeek-V3 stand-in shares the language model, so it gets the same vocabulary as a fast
`tokenizer.json` (`write_fast_tokenizer`), as the hub's DeepSeek-V3 ships its own.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

RESERVED_SPECIAL_TOKENS = 256
"""Special tokens after the ranks, as on the hub (163,584 ranks + 256 = 163,840 on Kimi-K2.5)."""

# The special tokens the pipeline and the engine read, at the hub's offsets after the ranks;
# the others are `<|reserved_token_{id}|>`.
SPECIAL_OFFSETS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    18: "<|media_begin|>",
    19: "<|media_content|>",
    20: "<|media_end|>",
    21: "<|media_pad|>",
    22: "<think>",
    23: "</think>",
    254: "[UNK]",
    255: "[PAD]",
}
CHAT_TOKENS = ("<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|start_header_id|>", "<|end_header_id|>", "[EOT]", "<|im_system|>", "<|im_middle|>")
"""The hub class's default `additional_special_tokens`."""

THINK_START, THINK_END = "<think>", "</think>"
DEFAULT_SYSTEM_PROMPT = "You are Kimi, an AI assistant created by Moonshot AI."

# Kimi's pre-tokenizer: Han runs, words with their leading mark, 1-3 digits, punctuation runs,
# newlines, spaces.
PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

# The chat template: the hub's layout, written here. Assistant turns up to the last one without
# tool calls are history: `<think></think>` and the answer (their reasoning is dropped); later
# ones (a tool call's thinking) keep `<think>reasoning</think>`. The default system turn comes
# first when the conversation has none.
CHAT_TEMPLATE = (
    """\
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}{%- elif content -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(history_end=-1) -%}
{%- for m in messages -%}{%- if m.role == 'assistant' and not m.tool_calls -%}{%- set ns.history_end = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- if not messages or messages[0].role != 'system' -%}<|im_system|>system<|im_middle|>"""
    + DEFAULT_SYSTEM_PROMPT
    + """<|im_end|>{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}
<|im_assistant|>assistant<|im_middle|>
{%- set reasoning = m.reasoning_content if m.reasoning_content is defined and m.reasoning_content is not none else (m.reasoning if m.reasoning is defined and m.reasoning is not none else '') -%}
{%- if loop.index0 > ns.history_end -%}<think>{{ reasoning }}</think>{%- else -%}<think></think>{%- endif -%}
{{ text(m.content) }}
{%- if m.tool_calls -%}<|tool_calls_section_begin|>{%- for call in m.tool_calls -%}<|tool_call_begin|>{{ call.id }}<|tool_call_argument_begin|>{{ call.function.arguments }}<|tool_call_end|>{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}
<|im_end|>
{%- elif m.role == 'user' -%}
<|im_user|>user<|im_middle|>{{ text(m.content) }}<|im_end|>
{%- else -%}
<|im_system|>{{ m.name if m.name is defined and m.name else m.role }}<|im_middle|>{{ text(m.content) }}<|im_end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}{%- endif -%}"""
)

REVISIONS = {
    "old": "from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode",
    "new": "from transformers.convert_slow_tokenizer import bytes_to_unicode",
}
"""The one line the hub's revisions differ in that matters here: where `bytes_to_unicode` comes
from. transformers 5 removed it from the GPT-2 module, so "old" fails to import there unless the
loader supplies it (`corpus/target.py`, and the engine's plugin)."""
REMOTE_MODULE = "tokenization_kimi"
REMOTE_CLASS = "TikTokenTokenizer"

_REMOTE_CODE = '''"""A TikToken tokenizer in the layout of Kimi-K2.5's: BPE ranks from tiktoken.model and 256
reserved special tokens after them. Written for eagle_assets' stand-in (revision {revision})."""

import os
from pathlib import Path
from shutil import copyfile
from typing import Dict, List, Optional, Tuple, Union

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tokenizers import AddedToken
from transformers.tokenization_utils import PreTrainedTokenizer
{import_line}

VOCAB_FILES_NAMES = {{"vocab_file": "tiktoken.model"}}
PAT_STR = {pat_str!r}


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]
    num_reserved_special_tokens = {reserved}

    def __init__(self, vocab_file, bos_token: Union[str, AddedToken] = "[BOS]", eos_token: Union[str, AddedToken] = "[EOS]",
                 unk_token=None, pad_token=None, additional_special_tokens: Optional[List[str]] = None,
                 added_tokens_decoder: Optional[dict] = None, **kwargs):
        if not os.path.isfile(vocab_file):
            raise FileNotFoundError(vocab_file)
        if additional_special_tokens is None:
            additional_special_tokens = {chat_tokens!r}
        named = {{int(i): str(getattr(t, "content", t)) for i, t in (added_tokens_decoder or {{}}).items()}}
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        first = len(ranks)
        self.special_tokens = {{named.get(i, f"<|reserved_token_{{i}}|>"): i for i in range(first, first + self.num_reserved_special_tokens)}}
        self.model = tiktoken.Encoding(name=Path(vocab_file).name, pat_str=PAT_STR, mergeable_ranks=ranks,
                                       special_tokens=self.special_tokens)
        self.n_words = self.model.n_vocab
        self.bos_id = self.special_tokens[str(bos_token)]
        self.eos_id = self.special_tokens[str(eos_token)]
        self.pad_id = self.special_tokens.get(str(pad_token), self.eos_id)
        self.unk_id = self.special_tokens.get(str(unk_token), self.eos_id)
        # Tokens as byte-level strings (GPT-2's printable alphabet), as slow tokenizers hand them out.
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {{c: b for b, c in self.byte_encoder.items()}}
        self.decoder = {{i: "".join(self.byte_encoder[b] for b in self.model.decode_single_token_bytes(i)) for i in range(self.n_words)}}
        self.encoder = {{s: i for i, s in self.decoder.items()}}
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token, pad_token=pad_token,
                         additional_special_tokens=additional_special_tokens, added_tokens_decoder=added_tokens_decoder, **kwargs)

    def encode(self, text: str, allow_special_tokens: bool = True, **kwargs) -> List[int]:
        """tiktoken's encoding, special tokens written in the text included; with other
        arguments, transformers' own path (which ends in `_tokenize` below)."""
        if kwargs:
            return super().encode(text, **kwargs)
        special = dict(allowed_special="all") if allow_special_tokens else dict(disallowed_special=())
        return self.model.encode(text, **special)

    def decode(self, token_ids, **kwargs) -> str:
        if kwargs:
            return super().decode(token_ids, **kwargs)
        return self.model.decode([token_ids] if isinstance(token_ids, int) else list(token_ids))

    @property
    def vocab_size(self) -> int:
        return self.n_words

    def get_vocab(self) -> Dict[str, int]:
        return dict(self.encoder)

    def _tokenize(self, text: str, **kwargs) -> List[str]:
        return [self.decoder[t] for t in self.encode(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.unk_id)

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder.get(index)

    def convert_tokens_to_string(self, tokens: List[str]) -> str:
        return bytes(self.byte_decoder[c] for c in "".join(tokens)).decode("utf-8", "replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: Optional[str] = None) -> Tuple[str]:
        out = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"])
        if os.path.abspath(self.vocab_file) != os.path.abspath(out):
            copyfile(self.vocab_file, out)
        return (out,)
'''


def remote_code(revision: str) -> str:
    """`tokenization_kimi.py` of one revision ("old" or "new", `REVISIONS`)."""
    if revision not in REVISIONS:
        raise ValueError(f"tokenizer revision {revision!r}: give one of {', '.join(REVISIONS)}")
    return _REMOTE_CODE.format(
        revision=revision, import_line=REVISIONS[revision], pat_str=PAT_STR, reserved=RESERVED_SPECIAL_TOKENS, chat_tokens=list(CHAT_TOKENS)
    )


def _byte_decoder() -> dict[str, int]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


def teacher_ranks(teacher_tokenizer_json: Path) -> list[bytes]:
    """SmolLM2's regular tokens as bytes in rank order: the single bytes it lacks first, then its
    tokens in id order (its merges come in id order, so tiktoken merges them as it does); its
    special tokens are left out (the stand-in's come after the ranks)."""
    tok = json.loads(Path(teacher_tokenizer_json).read_text())
    special = {t["id"] for t in tok["added_tokens"] if t.get("special")}
    decode = _byte_decoder()
    tokens = [bytes(decode[c] for c in s) for s, i in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1]) if i not in special]
    singles = {t[0] for t in tokens if len(t) == 1}
    return [bytes([b]) for b in range(256) if b not in singles] + tokens


def special_tokens(num_ranks: int) -> dict[int, str]:
    """id -> content of the 256 special tokens after `num_ranks` ranks."""
    return {num_ranks + k: SPECIAL_OFFSETS.get(k, f"<|reserved_token_{num_ranks + k}|>") for k in range(RESERVED_SPECIAL_TOKENS)}


def vocab_size(num_ranks: int) -> int:
    return num_ranks + RESERVED_SPECIAL_TOKENS


def token_id(num_ranks: int, content: str) -> int:
    """The id of a named special token (`SPECIAL_OFFSETS`)."""
    return num_ranks + next(k for k, name in SPECIAL_OFFSETS.items() if name == content)


def write_kimi_tokenizer(ranks: list[bytes], out: Path, revision: str = "old") -> None:
    """tiktoken.model, tokenization_kimi.py (of `revision`), tokenizer_config.json and
    chat_template.jinja into `out`, as the hub's Kimi-K2.5 folder holds them."""
    lines = [f"{base64.b64encode(t).decode()} {rank}" for rank, t in enumerate(ranks)]
    (out / "tiktoken.model").write_text("\n".join(lines) + "\n")
    (out / f"{REMOTE_MODULE}.py").write_text(remote_code(revision))
    specials = special_tokens(len(ranks))
    config = {
        "added_tokens_decoder": {
            str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
            for i, c in specials.items()
        },
        "additional_special_tokens": list(CHAT_TOKENS),
        "auto_map": {"AutoTokenizer": [f"{REMOTE_MODULE}.{REMOTE_CLASS}", None]},
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "extra_special_tokens": {},
        "model_max_length": 1048576,
        "pad_token": "[PAD]",
        "tokenizer_class": REMOTE_CLASS,
        "unk_token": "[UNK]",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def write_fast_tokenizer(kimi_folder: Path, out: Path) -> None:
    """The same vocabulary as a fast tokenizer (tokenizer.json, tokenizer_config.json and the chat
    template): transformers' own TikToken converter on the Kimi folder's ranks."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks_file = kimi_folder / "tiktoken.model"
    num_ranks = sum(1 for line in ranks_file.read_text().splitlines() if line.strip())
    specials = special_tokens(num_ranks)
    backend = TikTokenConverter(vocab_file=str(ranks_file), pattern=PAT_STR, extra_special_tokens=list(specials.values())).converted()
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]", unk_token="[UNK]")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
