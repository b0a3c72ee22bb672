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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "tiktoken.model")
"""A folder holding none of these has no tokenizer transformers can load."""


def check_tokenizer_folder(model_dir: str | Path, what: str = "the target") -> Path:
    """`model_dir` when it is a local folder holding a tokenizer; else a ValueError naming it and
    what it lacks, at once (transformers would take it for a hub id and answer seconds later
    about repository names)."""
    folder = Path(model_dir).expanduser()
    if not folder.is_dir():
        problem = "is a file, not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"{what} {str(model_dir)!r} {problem}: give the target's Hugging Face folder (config.json, tokenizer and chat template)")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"{what} {str(model_dir)!r} holds no tokenizer ({', '.join(TOKENIZER_FILES)}): give the target's Hugging Face folder")
    return folder


def load_tokenizer(model_dir: str | Path, trust_remote_code: bool = False) -> Any:
    """The target's own tokenizer (with its chat template), from a local folder only; a
    ValueError naming the folder when there is none to load."""
    check_tokenizer_folder(model_dir)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError) as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ValueError(f"the tokenizer in {model_dir} cannot be loaded: {first}") from None
