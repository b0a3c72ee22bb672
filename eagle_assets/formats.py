"""On-disk formats that the stages hand to each other: the contracts in one place.

Each stage writes what the next one reads; both import the names from here, so that a change
of format is one change. No dagster import: the GPU benchmarks and the trainer use this too.

Corpus (Parquet shards + `manifest.json`), written by `corpus/`, read by `hidden_states/`:
    one row per sample; columns `CORPUS_COLUMNS`. `input_ids` is exactly
    `tokenizer.apply_chat_template(messages, tokenize=True)` of the rebuilt conversation and
    `loss_mask` is 1 on assistant tokens (thinking included) and 0 elsewhere.

Hidden-state shard (one folder per shard, `shard-00007/`), written by `hidden_states/`, read
by the trainer through `hidden_states.reader`:
    `states.safetensors` holding, for the shard's samples concatenated along tokens,
      `aux`          (T, n_aux * H) bf16  r_k for each aux id k, ascending, concatenated as vLLM does
      `final`        (T, H)         bf16  the *normed* last hidden state: lm_head(final) = target logits
      `input_ids`    (T,)           int32
      `loss_mask`    (T,)           uint8
      `offsets`      (n + 1,)       int64 sample i spans tokens offsets[i]:offsets[i+1]
    and `manifest.json` (`ShardManifest`), which also records the file's size and SHA-256. A
    shard folder is complete iff its manifest exists and `hidden_states.reader.shard_problem`
    finds nothing wrong with it; folders are written under a temporary name and renamed into place.

Drafter export (`drafter-vllm/`, `drafter-sglang/`: `config.json` + `model.safetensors`), written
by `drafter/export.py`, read by the engines and by our preflight: `config.json` carries
`NUMBERING_KEY`, naming the engine whose aux-layer-id numbering it is written in.

Vocab mapping (`vocab_mapping.safetensors`):
    `d2t` (draft_vocab,) int64 with target_id = draft_id + d2t[draft_id], draft ids in
    ascending target-id order; `t2d` (vocab,) bool, True where a target id is in the draft
    vocabulary.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, field, fields

LAYER_ID_CONVENTION = "hf_hidden_states"
"""Id k = residual stream after k decoder layers = HF `output_hidden_states[k]` (0 = embeddings)."""

NUMBERING_KEY = "layer_id_numbering"
"""Extra config.json key of a drafter export naming the numbering of its aux layer ids: "vllm" or
"sglang" (SGLang's are one lower for the same layers). The engines ignore it."""

CORPUS_MANIFEST = "manifest.json"
CORPUS_FAILURES = "failures.jsonl"
CORPUS_COLUMNS = (
    "sample_id",  # str: stable_id(prompt, sampling, target)
    "prompt_id",  # str: stable id of the prompt alone
    "source",  # str: "file" | "magpie"
    "messages",  # str: JSON list of chat messages, assistant turns with "reasoning_content"
    "input_ids",  # list<int32>
    "loss_mask",  # list<uint8>
    "num_tokens",  # int32
    "num_turns",  # int32
    "finish_reason",  # str: the last turn's; "length" means truncated
    "truncated",  # bool
    "reasoning_captured",  # bool: every assistant turn carried reasoning_content
    "prompt_tokens",  # int32 (sum over turns, as the server counted)
    "completion_tokens",  # int32
    "latency_s",  # float64 (sum over turns)
    "sampling",  # str: JSON of the sampling parameters sent
    "target",  # str: target fingerprint
)

SHARD_STATES_FILE = "states.safetensors"
SHARD_MANIFEST_FILE = "manifest.json"
VOCAB_MAPPING_FILE = "vocab_mapping.safetensors"


def stable_id(*parts: object) -> str:
    """A short hash that is the same on every machine and run for the same parts."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:20]


def shard_of(sample_id: str, num_shards: int) -> int:
    """The hidden-state shard a sample belongs to: stable, so one shard rebuilds alone."""
    return int(hashlib.sha256(sample_id.encode()).hexdigest()[:8], 16) % num_shards


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


@dataclass
class ShardManifest:
    """What one hidden-state shard holds; written last, so its presence means complete."""

    shard: int
    num_shards: int
    sample_ids: list[str]
    token_counts: list[int]
    aux_layer_ids: list[int]
    hidden_size: int
    target_fingerprint: str
    corpus_fingerprint: str
    layer_id_convention: str = LAYER_ID_CONVENTION
    dtype: str = "bfloat16"
    final_state: str = "normed"  # lm_head(final) gives the target's logits
    bytes_per_token: int = 0
    extra: dict = field(default_factory=dict)
    states_bytes: int = 0
    """Size of `states.safetensors` at commit (0: not recorded, a manifest from before it was)."""
    states_sha256: str = ""
    """SHA-256 of `states.safetensors` at commit ("" when not recorded)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str | bytes) -> "ShardManifest":
        """Parse and type-check a manifest: a ValueError saying what is wrong (not JSON, not an
        object, a key missing or unknown, a value of the wrong type), never a TypeError."""
        try:
            raw = json.loads(text)
        except ValueError as exc:  # JSONDecodeError, and UnicodeDecodeError for binary garbage
            raise ValueError(f"not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"a JSON {type(raw).__name__}, not an object")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        missing = [n for n, f in known.items() if n not in raw and f.default is MISSING and f.default_factory is MISSING]
        if unknown or missing:
            raise ValueError(f"keys unknown {unknown}, missing {missing}")
        for name, value in raw.items():
            if not _MANIFEST_TYPES[name](value):
                raise ValueError(f"{name} is {value!r:.80}, not {_MANIFEST_TYPE_NAMES[name]}")
        return cls(**raw)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_MANIFEST_KINDS = {
    int: ("an integer", _is_int),
    str: ("a string", lambda v: isinstance(v, str)),
    dict: ("an object", lambda v: isinstance(v, dict)),
    "list[str]": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "list[int]": ("a list of integers", lambda v: isinstance(v, list) and all(_is_int(x) for x in v)),
}
_MANIFEST_FIELD_KINDS = {
    "shard": int,
    "num_shards": int,
    "sample_ids": "list[str]",
    "token_counts": "list[int]",
    "aux_layer_ids": "list[int]",
    "hidden_size": int,
    "target_fingerprint": str,
    "corpus_fingerprint": str,
    "layer_id_convention": str,
    "dtype": str,
    "final_state": str,
    "bytes_per_token": int,
    "extra": dict,
    "states_bytes": int,
    "states_sha256": str,
}
_MANIFEST_TYPES = {k: _MANIFEST_KINDS[kind][1] for k, kind in _MANIFEST_FIELD_KINDS.items()}
_MANIFEST_TYPE_NAMES = {k: _MANIFEST_KINDS[kind][0] for k, kind in _MANIFEST_FIELD_KINDS.items()}
assert set(_MANIFEST_FIELD_KINDS) == {f.name for f in fields(ShardManifest)}, "a ShardManifest field has no type check"


def hidden_state_bytes_per_token(num_aux: int, hidden_size: int) -> int:
    """Bytes one token costs in a shard: (aux + final) bf16 states, int32 id, uint8 mask."""
    return (num_aux + 1) * hidden_size * 2 + 4 + 1
