"""The target as the corpus sees it: its tokenizer and a fingerprint of what shapes its answers.

The fingerprint goes into every sample id, so a corpus made for one target is never resumed
with another. It hashes the files that change the answers or their token ids (config,
generation config, tokenizer, chat template) and the names and sizes of the weight files:
cheap even for a 1T-parameter target, where hashing the weights would take hours.

    from eagle_assets.corpus.target import load_tokenizer, target_fingerprint
    tokenizer = load_tokenizer(model_dir)
    fingerprint = target_fingerprint(model_dir)
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

# Files whose bytes decide the answers or the ids; missing ones are simply not hashed.
_HASHED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "tiktoken.model",
)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def target_fingerprint(model_dir: str | Path) -> str:
    """A short stable hash of the target's config, tokenizer, template and weight file layout."""
    folder = Path(model_dir)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{folder} is not a model folder (no config.json); pass the target's HF folder "
            "(for the embedded target: eagle_assets.embedded_target.pull())"
        )
    h = hashlib.sha256()
    for name in _HASHED_FILES:
        path = folder / name
        if path.is_file():
            h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    for path in sorted(folder.iterdir()):
        if path.suffix in _WEIGHT_SUFFIXES:
            h.update(f"{path.name}:{path.stat().st_size}".encode())
    return f"{folder.name}-{h.hexdigest()[:16]}"


def load_tokenizer(model_dir: str | Path, trust_remote_code: bool = False) -> Any:
    """The target's own tokenizer (with its chat template), from a local folder only."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code, local_files_only=True)
